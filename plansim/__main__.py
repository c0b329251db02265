from plansim.cli import main

raise SystemExit(main())
