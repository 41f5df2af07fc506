from proxy.server.cli import main

main()
