"""The server process: options, worker processes, the listening socket, connections, a graceful exit."""
