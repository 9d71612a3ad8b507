from autocompile.cli import main

raise SystemExit(main())
