"""The application above the services: the `gyre` command, the demo and the local dev stack (shell).

It may use every service's public contracts and start every service; nothing imports it. The
kernel (`gyre/`) stays plumbing only and never names a service (DESIGN §2).
"""
