from localchat.cli.app import main

main()
