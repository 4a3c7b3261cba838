// The JavaScript clients the tests drive against the proxy (tests/test_js_clients.py):
// `node tests/js/clients.mjs <scenario>` with PROXY_URL set prints one JSON object, what the
// client made of the proxy's answer. The SDKs' own accumulators, parsers and validators do
// the judging: a malformed stream or an invalid object throws, and the script exits non-zero.
import Anthropic from '@anthropic-ai/sdk';
import { betaTool } from '@anthropic-ai/sdk/helpers/beta/json-schema';
import { zodOutputFormat } from '@anthropic-ai/sdk/helpers/zod';
import { createAnthropic } from '@ai-sdk/anthropic';
import { generateText, Output, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';

const baseURL = process.env.PROXY_URL;
const model = 'claude-sonnet-4-6';
const City = z.object({ city: z.string(), population: z.number() });
const weatherSchema = {
  type: 'object',
  properties: { city: { type: 'string' } },
  required: ['city'],
};
const weather = (city) => `sunny in ${city}`;

function sdk() {
  return new Anthropic({ baseURL, apiKey: 'sk-js-client', maxRetries: 0 });
}

function vercel() {
  return createAnthropic({ baseURL: `${baseURL}/v1`, apiKey: 'sk-js-client' })(model);
}

const scenarios = {
  // TypeScript SDK: MessageStream accumulates our SSE into the final message.
  async 'ts-stream'() {
    const stream = sdk().messages.stream({
      model, max_tokens: 200, messages: [{ role: 'user', content: 'say hi' }],
      tools: [{ name: 'get_weather', description: 'Weather', input_schema: weatherSchema }],
    });
    const events = [];
    stream.on('streamEvent', (event) => events.push(event.type));
    const message = await stream.finalMessage();
    return { message, events };
  },

  // TypeScript SDK: a whole Message with a tool call, then the call sent back with its
  // result (the call's input as the Message gave it).
  async 'ts-create-and-answer'() {
    const client = sdk();
    const tools = [{ name: 'get_weather', description: 'Weather', input_schema: weatherSchema }];
    const question = { role: 'user', content: 'weather in Paris?' };
    const message = await client.messages.create({
      model, max_tokens: 200, tools, messages: [question],
    });
    const call = message.content.find((block) => block.type === 'tool_use');
    const answer = await client.messages.create({
      model, max_tokens: 200, tools, messages: [
        question, { role: 'assistant', content: message.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id,
                                    content: 'bad input', is_error: true }] }],
    });
    return { message, answer };
  },

  // TypeScript SDK: messages.parse() with a zod schema (output_config.format).
  async 'ts-parse'() {
    const message = await sdk().messages.parse({
      model, max_tokens: 200, messages: [{ role: 'user', content: 'the largest city' }],
      output_config: { format: zodOutputFormat(City) },
    });
    return { parsed: message.parsed_output, content: message.content };
  },

  // TypeScript SDK: the beta tool runner (threaded by default), streaming each turn.
  async 'ts-tool-runner'() {
    const runner = sdk().beta.messages.toolRunner({
      model, max_tokens: 200, stream: true,
      messages: [{ role: 'user', content: 'weather in Paris?' }],
      tools: [betaTool({
        name: 'get_weather', description: 'Weather of a city', inputSchema: weatherSchema,
        run: ({ city }) => weather(city),
      })],
    });
    const turns = [];
    for await (const stream of runner) {
      turns.push(await stream.finalMessage());
    }
    return { turns, history: runner.params.messages };
  },

  // Vercel AI SDK: generateText with Output.object returns the parsed, validated object.
  async 'vercel-object'() {
    const result = await generateText({
      model: vercel(), output: Output.object({ schema: City }), prompt: 'the largest city',
    });
    return { output: result.output, text: result.text };
  },

  // Vercel AI SDK: streamText through a tool call and its result, two steps.
  async 'vercel-stream-tools'() {
    const result = streamText({
      model: vercel(), prompt: 'weather in Paris?', stopWhen: stepCountIs(3),
      tools: {
        get_weather: tool({
          description: 'Weather of a city', inputSchema: z.object({ city: z.string() }),
          execute: async ({ city }) => weather(city),
        }),
      },
    });
    const parts = [];
    for await (const part of result.fullStream) {
      if (part.type === 'error') throw part.error;
      parts.push(part.type);
    }
    const steps = await result.steps;
    return {
      text: await result.text,
      finishReason: await result.finishReason,
      toolCalls: steps.flatMap((step) => step.toolCalls.map((c) => ({ name: c.toolName, input: c.input }))),
      toolResults: steps.flatMap((step) => step.toolResults.map((r) => r.output)),
      parts,
    };
  },
};

const name = process.argv[2];
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(', ')}`);
  process.exit(2);
}
process.stdout.write(JSON.stringify(await scenarios[name]()) + '\n');
