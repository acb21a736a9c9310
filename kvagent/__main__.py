from kvagent.cli import main

main()
