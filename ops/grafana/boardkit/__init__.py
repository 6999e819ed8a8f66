"""The pieces ops/grafana/boards.py builds the boards from: panel helpers (panels.py) and the
boards themselves (service_boards.py: overview, workers, Kafka; run_boards.py: runs)."""
