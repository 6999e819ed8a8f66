from evalstream.cli.main import main

main()
