"""The client's `stop_sequences`, matched by the proxy in the text it relays.

Most OpenAI-compatible servers cut the text at a `stop` string but say only
`finish_reason: "stop"` (llama.cpp, Ollama, most hosted APIs), so the client could not be told
which sequence matched, nor even that one did: Anthropic answers `stop_reason: "stop_sequence"`
and names the string, and clients branch on it. So the sequences are withheld from such
upstreams and matched here, across chunk boundaries, for any number of sequences; the stream
ends at the match (the sequence itself is not part of the text, as with Anthropic) and the
upstream is cancelled. vLLM (and SGLang behind the `vllm` profile) report the matched string
(`stop_reason`, `matched_stop`), so they get `stop` and stop on their own.
"""

from __future__ import annotations

from collections.abc import Iterable

STOP_REPORTING_PROFILES = frozenset({"vllm"})
"""Profiles whose servers take `stop` and name the sequence that matched."""


class StopMatcher:
    """Text in, the text that may be relayed out; holds back only what could still become
    the start of a sequence, and reports the sequence that completes first."""

    def __init__(self, sequences: Iterable[str]) -> None:
        self.sequences = tuple(dict.fromkeys(s for s in sequences if isinstance(s, str) and s))
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text to relay, the sequence that matched or None). After a match the caller
        stops feeding: the text from the match on is never relayed."""
        buffer = self._held + text
        match = self._first_match(buffer)
        if match is not None:
            start, sequence = match
            self._held = ""
            return buffer[:start], sequence
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], None

    def flush(self) -> str:
        """The held-back text: the text ended (or other content follows) without a match."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        """The sequence whose occurrence ends first (it was generated first); on a tie the
        one that starts first."""
        best: tuple[int, int, str] | None = None
        for sequence in self.sequences:
            start = buffer.find(sequence)
            if start < 0:
                continue
            candidate = (start + len(sequence), start, sequence)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _partial_suffix(self, buffer: str) -> int:
        """The length of the longest end of `buffer` that begins some sequence."""
        longest = max((len(s) for s in self.sequences), default=0) - 1
        for size in range(min(longest, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(sequence.startswith(tail) for sequence in self.sequences):
                return size
        return 0
