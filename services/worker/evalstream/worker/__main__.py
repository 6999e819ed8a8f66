from evalstream.common import service


def main() -> None:
    from evalstream.worker.app import app, settings

    service.run(app, settings)


if __name__ == "__main__":
    main()
