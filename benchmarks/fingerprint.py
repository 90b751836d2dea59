"""Per-request cost of the model fingerprint: from scratch vs incremental (PERF-1).

Run: `python benchmarks/fingerprint.py`. Not a test; prints one table and takes well under a minute.
`--smoke` runs the two smallest sizes for a few steps: only to check the script still runs (PERF-4).

A history of N messages is what a long tool-using run holds: a system prompt and a user prompt, then
pairs of a model response (200-2,000 characters of text plus a tool call) and a tool return (200-2,000
characters in a list of rows). "incremental" is `ModelFingerprinter` at a step that appends such a pair
to the history of its previous call; "full" is `fingerprint_model_request` over the same N messages.
Times are wall-clock per call; the median is the typical cost, the minimum the cost on an idle CPU.
"""

from __future__ import annotations

import random
import statistics
import string
import sys
import time
from collections.abc import Callable

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from pydantic_ai_durable._fingerprint import ModelFingerprinter, fingerprint_model_request

SIZES = (10, 100, 1_000, 3_000)
SETTINGS = {'temperature': 0.2, 'max_tokens': 2_000, 'timeout': 60.0}
IDENTITY = 'openai:gpt-5'


def prose(rng: random.Random, low: int = 200, high: int = 2_000) -> str:
    length = rng.randint(low, high)
    words: list[str] = []
    while sum(map(len, words)) + len(words) < length:
        words.append(''.join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))))
    return ' '.join(words)[:length]


def step_messages(rng: random.Random, index: int) -> list[ModelMessage]:
    """One model response with a tool call, and the request carrying its result."""
    call_id = f'call_{index:05d}'
    rows = [prose(rng, 60, 600) for _ in range(rng.randint(1, 4))]
    return [
        ModelResponse(
            parts=[
                TextPart(prose(rng)),
                ToolCallPart('search_orders', {'query': prose(rng, 20, 80), 'limit': rng.randint(1, 50)}, call_id),
            ],
            model_name='gpt-5',
        ),
        ModelRequest(parts=[ToolReturnPart('search_orders', {'rows': rows, 'count': len(rows)}, call_id)]),
    ]


def build_history(length: int, seed: int = 7) -> list[ModelMessage]:
    rng = random.Random(seed)
    messages: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart(prose(rng, 800, 1_500)), UserPromptPart(prose(rng, 200, 600))])
    ]
    index = 0
    while len(messages) < length:
        messages.extend(step_messages(rng, index))
        index += 1
    return messages[:length]


def build_params() -> ModelRequestParameters:
    def schema(index: int) -> dict[str, object]:
        properties = {f'field_{n}': {'type': 'string', 'description': f'Filter {n} of tool {index}.'} for n in range(4)}
        return {'type': 'object', 'properties': properties, 'required': ['field_0'], 'additionalProperties': False}

    def definition(index: int) -> ToolDefinition:
        description = f'Tool {index}: ' + 'does things. ' * 8
        return ToolDefinition(name=f'tool_{index}', description=description, parameters_json_schema=schema(index))

    return ModelRequestParameters(function_tools=[definition(index) for index in range(5)])


Sample = tuple[float, float]
"""Wall-clock and CPU seconds of one call: under load the CPU time still shows the cost of the call itself."""


def timed(call: Callable[[], object]) -> Sample:
    wall, cpu = time.perf_counter(), time.thread_time()
    call()
    return time.perf_counter() - wall, time.thread_time() - cpu


def measure_full(history: list[ModelMessage], repeats: int) -> list[Sample]:
    params = build_params()
    return [timed(lambda: fingerprint_model_request(IDENTITY, history, SETTINGS, params)) for _ in range(repeats)]


def measure_incremental(history: list[ModelMessage], base: int, steps: int) -> list[Sample]:
    """Each timed call sees the previous call's history plus two messages, with freshly built parameters."""
    fingerprinter = ModelFingerprinter()
    fingerprinter.fingerprint(IDENTITY, history[:base], SETTINGS, build_params())
    samples = []
    for step in range(steps):
        current = history[: base + 2 * (step + 1)]
        params = build_params()  # pydantic-ai prepares new parameters for every request
        samples.append(timed(lambda: fingerprinter.fingerprint(IDENTITY, current, dict(SETTINGS), params)))  # noqa: B023
    final = history[: base + 2 * steps]
    assert fingerprinter.fingerprint(IDENTITY, final, SETTINGS, build_params()) == fingerprint_model_request(
        IDENTITY, final, SETTINGS, build_params()
    )
    return samples


def reference_loop() -> float:
    """A fixed pure-Python workload, to compare this machine's speed with another's."""
    return min(timed(lambda: sum(range(1_000)))[1] for _ in range(2_000))


def micros(seconds: float) -> str:
    return f'{seconds * 1e6:,.0f}'


def main() -> None:
    smoke = '--smoke' in sys.argv[1:]
    sizes, steps = (SIZES[:2], 5) if smoke else (SIZES, 200)
    history = build_history(max(sizes) + 2 * steps)
    measure_incremental(history, 10, 20)  # warm up adapters and caches
    rows = []
    for size in sizes:
        full = measure_full(history[:size], repeats=max(3, min(30, 3_000 // size)))
        incremental = measure_incremental(history, size, steps)
        rows.append((size, full, incremental))

    print(f'Model fingerprint per request, microseconds (Python {sys.version.split()[0]})')
    columns = ('messages', 'full wall', 'full CPU', 'incr. wall', 'incr. CPU', 'incr. min', 'speed-up')
    header = '{:>9} | {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>8}'.format(*columns)
    print(header)
    print('-' * len(header))
    for size, full, incremental in rows:
        full_wall, full_cpu = (statistics.median(sample[i] for sample in full) for i in (0, 1))
        incr_wall, incr_cpu = (statistics.median(sample[i] for sample in incremental) for i in (0, 1))
        fastest = min(sample[0] for sample in incremental)
        print(
            f'{size:>9,} | {micros(full_wall):>10} {micros(full_cpu):>10} | {micros(incr_wall):>10} '
            f'{micros(incr_cpu):>10} {micros(fastest):>10} | {f"{full_cpu / incr_cpu:,.0f}x":>8}'
        )
    print('wall and CPU are medians; "incr. min" is the fastest wall-clock step; speed-up compares CPU medians.')
    print(f'incremental: a step appending 2 messages (a response with a tool call, its tool return); {steps} steps')
    print(f'machine reference: sum(range(1000)) takes {micros(reference_loop())} us of CPU here')


if __name__ == '__main__':
    main()
