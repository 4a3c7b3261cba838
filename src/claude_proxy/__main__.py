from claude_proxy.cli import main

raise SystemExit(main())
