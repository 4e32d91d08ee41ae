from sparkonce.cli import main

raise SystemExit(main())
