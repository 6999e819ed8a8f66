"""The parts of ops/local/stack.py: config (paths, ports, helpers), installs, proc (a
background process), and one module per piece of infrastructure."""
