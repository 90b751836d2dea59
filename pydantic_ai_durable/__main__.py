"""`python -m pydantic_ai_durable`: the inspection CLI, also installed as `pydantic-ai-durable`.

Kept to a single call so that importing the package never runs the CLI; the program name in usage
messages is the command the user typed.
"""

from ._cli import main

if __name__ == '__main__':
    raise SystemExit(main(prog='python -m pydantic_ai_durable'))
