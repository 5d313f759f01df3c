from launcher.launch import main

raise SystemExit(main())
