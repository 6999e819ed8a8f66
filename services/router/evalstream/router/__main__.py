from evalstream.common import service


def main() -> None:
    from evalstream.router.app import app, settings

    service.run(app, settings)


if __name__ == "__main__":
    main()
