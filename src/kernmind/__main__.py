from kernmind.cli import main

raise SystemExit(main())
