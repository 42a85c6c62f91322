"""Run the scripted OpenAI-compatible server (the `demo` model): ``python -m loopd.harness.models.scripted_server``."""

from loopd.harness.models._scripted_server import main

if __name__ == "__main__":
    main()
