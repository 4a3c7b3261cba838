from claude_proxy.cli.command_line import main

raise SystemExit(main())
