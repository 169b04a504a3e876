from localchat.cli import main

main()
