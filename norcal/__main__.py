from norcal.cli import main

raise SystemExit(main())
