from corral.cli._main import main

raise SystemExit(main())
