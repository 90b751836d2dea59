"""Secret masking (K-1..K-6)."""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import json
import threading
from typing import Any, NamedTuple

import pydantic.dataclasses
import pytest
from pydantic import BaseModel
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart

from pydantic_ai_durable._masking import (
    CIRCULAR_REFERENCE,
    MASK,
    SECRETS,
    SecretRegistry,
    register_secret,
)

S = 'sk-live-4f9a2c'


@pytest.fixture
def reg() -> SecretRegistry:
    registry = SecretRegistry()
    registry.register(S)
    return registry


# --- K-1: what is masked -------------------------------------------------------------------------


def test_k1_every_occurrence_in_a_string_is_masked(reg: SecretRegistry) -> None:
    assert reg.mask(f'{S} and {S}{S}') == '*** and ******'


def test_k1_no_secret_registered_returns_the_value_itself() -> None:
    registry = SecretRegistry()
    value = {'a': [S, (1, 2)]}
    assert not registry
    assert registry.mask(value) is value


def test_k1_value_without_secret_is_returned_uncopied(reg: SecretRegistry) -> None:
    inner = {'b': ('x', 2.5, None, True)}
    value = {'a': [inner, {'c', 'd'}], 'e': b'bytes'}
    masked = reg.mask(value)
    assert masked is value
    assert masked['a'][0] is inner


def test_k1_only_the_changed_path_is_copied(reg: SecretRegistry) -> None:
    untouched = {'keep': [1, 2, 3]}
    value = {'left': untouched, 'right': [S]}
    masked = reg.mask(value)
    assert masked == {'left': {'keep': [1, 2, 3]}, 'right': [MASK]}
    assert masked['left'] is untouched
    assert value['right'] == [S]


def test_k1_no_key_name_heuristics(reg: SecretRegistry) -> None:
    value = {'password_policy': 'rotate', 'auth_type': 'bearer', 'token': 'not-a-secret'}
    assert reg.mask(value) is value
    assert json.loads(reg.dumps_masked(value)) == value


def test_k1_longest_secret_wins() -> None:
    registry = SecretRegistry()
    registry.register('pass')
    registry.register('password123')
    assert registry.mask('password123 / pass / password') == '*** / *** / ***word'


def test_k1_overlapping_secrets_leave_no_fragment() -> None:
    registry = SecretRegistry()
    registry.register('abcd')
    registry.register('cdefgh')
    assert registry.mask('xabcdefghy') == 'x***y'


def test_k1_empty_secret_is_ignored() -> None:
    registry = SecretRegistry()
    registry.register('')
    assert not registry
    assert registry.generation == 0
    assert registry.mask('anything') == 'anything'


def test_k1_secret_must_be_a_string() -> None:
    with pytest.raises(TypeError):
        SecretRegistry().register(123)  # type: ignore[arg-type]


def test_k1_generation_increments_on_every_new_secret() -> None:
    registry = SecretRegistry()
    assert registry.generation == 0
    registry.register('one')
    assert registry.generation == 1
    registry.register('two')
    assert registry.generation == 2
    registry.register('one')  # already known: masking does not change, caches stay valid
    assert registry.generation == 2
    assert len(registry) == 2


def test_k1_registration_from_many_threads() -> None:
    registry = SecretRegistry()
    threads = [threading.Thread(target=registry.register, args=(f'secret-{i}',)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert registry.generation == 50
    assert registry.mask(' '.join(f'secret-{i}' for i in range(50))) == ' '.join([MASK] * 50)


def test_k1_process_wide_registry() -> None:
    secret = 'process-wide-secret-7d1e'
    before = SECRETS.generation
    register_secret(secret)
    assert SECRETS.generation == before + 1
    assert SECRETS.mask({'x': f'a{secret}b'}) == {'x': f'a{MASK}b'}


# --- K-2: structure ------------------------------------------------------------------------------


def test_k2_nested_structure_keeps_types(reg: SecretRegistry) -> None:
    value = {'rows': [(1, S)], 'tags': {S}, 'note': f'key={S}', S: 1}
    masked = reg.mask(value)
    assert masked == {'rows': [(1, '***')], 'tags': {'***'}, 'note': 'key=***', '***': 1}
    assert isinstance(masked, dict)
    assert type(masked['rows'][0]) is tuple
    assert type(masked['tags']) is set
    assert value == {'rows': [(1, S)], 'tags': {S}, 'note': f'key={S}', S: 1}


def test_k2_keys_that_mask_alike_collapse(reg: SecretRegistry) -> None:
    assert reg.mask({S: 1, MASK: 2, 'a': 3}) == {MASK: 2, 'a': 3}
    two = SecretRegistry()
    two.register('first-secret')
    two.register('second-secret')
    assert two.mask({'first-secret': 1, 'second-secret': 2}) == {MASK: 2}


def test_k2_frozenset_and_tuple_keys(reg: SecretRegistry) -> None:
    masked = reg.mask({(S, 1): frozenset({S, 'x'})})
    assert masked == {(MASK, 1): frozenset({MASK, 'x'})}
    assert type(next(iter(masked.values()))) is frozenset


def test_k2_subclasses_of_containers_keep_their_type(reg: SecretRegistry) -> None:
    class Point(NamedTuple):
        x: str
        y: int

    ordered = collections.OrderedDict([('a', S)])
    default = collections.defaultdict(list, {'a': [S]})
    assert reg.mask(Point(S, 1)) == Point(MASK, 1)
    assert type(reg.mask(Point(S, 1))) is Point
    masked_ordered = reg.mask(ordered)
    assert type(masked_ordered) is collections.OrderedDict
    assert masked_ordered == {'a': MASK}
    masked_default = reg.mask(default)
    assert type(masked_default) is collections.defaultdict
    assert masked_default.default_factory is list
    assert masked_default == {'a': [MASK]}
    assert ordered['a'] == S and default['a'] == [S]


@dataclasses.dataclass(frozen=True)
class Frozen:
    token: str
    count: int = 0


@dataclasses.dataclass(slots=True)
class Slotted:
    token: str
    other: list[str]


@dataclasses.dataclass
class WithInitVar:
    name: str
    seed: dataclasses.InitVar[str]
    derived: str = dataclasses.field(init=False)

    def __post_init__(self, seed: str) -> None:
        self.derived = f'derived-{seed}'


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlotted:
    token: str


def test_k2_frozen_dataclass(reg: SecretRegistry) -> None:
    original = Frozen(f'token={S}', 3)
    masked = reg.mask(original)
    assert type(masked) is Frozen
    assert masked == Frozen('token=***', 3)
    assert original.token == f'token={S}'


def test_k2_slotted_dataclass(reg: SecretRegistry) -> None:
    original = Slotted(S, ['a', S])
    masked = reg.mask(original)
    assert type(masked) is Slotted
    assert masked == Slotted(MASK, ['a', MASK])
    assert original == Slotted(S, ['a', S])
    frozen_slotted = FrozenSlotted(S)
    assert reg.mask(frozen_slotted) == FrozenSlotted(MASK)
    assert frozen_slotted.token == S


def test_k2_initvar_and_init_false_fields(reg: SecretRegistry) -> None:
    original = WithInitVar(S, seed=S)
    masked = reg.mask(original)
    assert type(masked) is WithInitVar
    assert masked is not original
    assert masked.name == MASK
    assert masked.derived == f'derived-{MASK}'
    assert original.name == S and original.derived == f'derived-{S}'


def test_k2_unchanged_dataclass_is_the_same_object(reg: SecretRegistry) -> None:
    value = Frozen('harmless')
    assert reg.mask(value) is value


def test_k2_dataclass_holding_message_history(reg: SecretRegistry) -> None:
    request = ModelRequest(parts=[UserPromptPart(content=f'use {S} please')])
    masked: Any = reg.mask([request])
    assert isinstance(masked, list)
    part = masked[0].parts[0]
    assert part.content == 'use *** please'
    original_part = request.parts[0]
    assert isinstance(original_part, UserPromptPart)
    assert part.timestamp == original_part.timestamp
    assert original_part.content == f'use {S} please'


def test_k2_depth_500_nesting(reg: SecretRegistry) -> None:
    value: Any = S
    for depth in range(500):
        value = {'level': depth, 'child': [value]} if depth % 2 else (value, depth)
    masked: Any = reg.mask(value)
    text = reg.dumps_masked(value)
    assert S not in text and MASK in text
    for depth in reversed(range(500)):
        masked = masked['child'][0] if depth % 2 else masked[0]
    assert masked == MASK


def test_k2_far_deeper_than_the_recursion_limit(reg: SecretRegistry) -> None:
    root: list[Any] = []
    node = root
    for _ in range(20_000):
        child: list[Any] = []
        node.append(child)
        node = child
    node.append(S)
    masked: Any = reg.mask(root)
    for _ in range(20_000):
        masked = masked[0]
    assert masked == [MASK]
    assert node == [S]


# --- K-3: bytes ----------------------------------------------------------------------------------


def test_k3_bytes_are_masked(reg: SecretRegistry) -> None:
    assert reg.mask(f'key={S}'.encode()) == b'key=***'
    assert reg.mask(bytearray(f'key={S}'.encode())) == bytearray(b'key=***')
    assert type(reg.mask(bytearray(f'key={S}'.encode()))) is bytearray


def test_k3_invalid_utf8_survives(reg: SecretRegistry) -> None:
    data = b'\xff\xfe' + S.encode() + b'\x80tail'
    assert reg.mask(data) == b'\xff\xfe***\x80tail'


def test_k3_bytes_without_secret_are_the_same_object(reg: SecretRegistry) -> None:
    data = b'\xff harmless \x00'
    assert reg.mask(data) is data


# --- K-4: pydantic models, multimodal content, other objects -------------------------------------


class Credentials(BaseModel):
    user: str
    key: str
    scopes: tuple[str, ...] = ()


def test_k4_model_holding_secret_becomes_masked_data(reg: SecretRegistry) -> None:
    model = Credentials(user='ann', key=S, scopes=('read',))
    assert reg.mask(model) == {'user': 'ann', 'key': MASK, 'scopes': ['read']}
    assert model.key == S


def test_k4_model_without_secret_is_the_same_object(reg: SecretRegistry) -> None:
    model = Credentials(user='ann', key='public')
    assert reg.mask(model) is model
    in_list: Any = reg.mask([model])
    assert in_list[0] is model


def test_k4_binary_content_passes_through(reg: SecretRegistry) -> None:
    content = BinaryContent(data=f'key={S}'.encode(), media_type='text/plain')
    assert reg.mask(content) is content
    in_dict: Any = reg.mask({'c': content})
    assert in_dict['c'] is content


def test_k4_other_objects_pass_through(reg: SecretRegistry) -> None:
    class Opaque:
        def __init__(self) -> None:
            self.secret = S

    opaque = Opaque()
    assert reg.mask(opaque) is opaque


# --- K-5: circular references --------------------------------------------------------------------


def test_k5_self_containing_list(reg: SecretRegistry) -> None:
    value: list[Any] = [S]
    value.append(value)
    masked = reg.mask(value)
    assert masked == [MASK, CIRCULAR_REFERENCE]
    assert value[0] == S and value[1] is value


def test_k5_cycle_through_a_dict_without_secret(reg: SecretRegistry) -> None:
    value: dict[str, Any] = {'a': 1}
    value['self'] = [value]
    assert reg.mask(value) == {'a': 1, 'self': [CIRCULAR_REFERENCE]}


def test_k5_shared_but_acyclic_data_is_not_a_cycle(reg: SecretRegistry) -> None:
    shared = [S]
    assert reg.mask([shared, shared, {'x': shared}]) == [[MASK], [MASK], {'x': [MASK]}]


# --- K-6: dumps_masked ---------------------------------------------------------------------------


@pytest.mark.parametrize('secret', ['pa"ss"word', 'back\\slash\\', 'pässwörd-日本', 'mixed"\\é\n'])
def test_k6_secrets_that_json_escapes(secret: str) -> None:
    registry = SecretRegistry()
    registry.register(secret)
    value = {'note': f'secret={secret};', secret: [secret, (secret,)], 'raw': f'x{secret}'.encode()}
    for ensure_ascii in (True, False):
        text = registry.dumps_masked(value, ensure_ascii=ensure_ascii)
        assert json.loads(text) == {'note': 'secret=***;', MASK: [MASK, [MASK]], 'raw': f'x{MASK}'}
        assert secret not in text
        assert json.dumps(secret)[1:-1] not in text


def test_k6_unrelated_key_untouched(reg: SecretRegistry) -> None:
    assert reg.dumps_masked({'password_policy': 'rotate'}) == json.dumps({'password_policy': 'rotate'})


def test_k6_json_kwargs_are_forwarded(reg: SecretRegistry) -> None:
    assert reg.dumps_masked({'b': S, 'a': 1}, sort_keys=True, separators=(',', ':')) == '{"a":1,"b":"***"}'


def test_k6_default_renders_leftover_types(reg: SecretRegistry) -> None:
    class Opaque:
        def __str__(self) -> str:
            return f'opaque holding {S}'

    value = {
        'bytes': b'\xffok',
        'model': Credentials(user='ann', key='public'),
        'dataclass': Frozen('harmless', 2),
        'binary': BinaryContent(data=f'{S}'.encode(), media_type='text/plain'),
        'opaque': Opaque(),
        'set': {'b', 'a'},
    }
    decoded = json.loads(reg.dumps_masked(value))
    assert decoded['bytes'] == '\ufffdok'
    assert decoded['model'] == {'user': 'ann', 'key': 'public', 'scopes': []}
    assert decoded['dataclass'] == {'token': 'harmless', 'count': 2}
    assert decoded['binary']['data'] == MASK
    assert decoded['opaque'] == f'opaque holding {MASK}'
    assert decoded['set'] == ['a', 'b']


def test_k6_user_default_is_used_for_unknown_objects(reg: SecretRegistry) -> None:
    class Opaque:
        pass

    text = reg.dumps_masked([Opaque()], default=lambda obj: {'opaque': S})
    assert json.loads(text) == [{'opaque': MASK}]


def test_k6_without_secrets_is_plain_json() -> None:
    registry = SecretRegistry()
    value = {'a': [1, 'x'], 'b': None}
    assert registry.dumps_masked(value) == json.dumps(value)


def test_k6_masking_does_not_mutate_deep_copies(reg: SecretRegistry) -> None:
    value = {'a': [S, {'b': {S}}], 'c': Frozen(S)}
    snapshot = copy.deepcopy(value)
    reg.mask(value)
    reg.dumps_masked(value)
    assert value == snapshot


@dataclasses.dataclass
class Node:
    label: str
    children: list[Any]


def test_k5_cycle_through_a_dataclass(reg: SecretRegistry) -> None:
    node = Node(S, [])
    node.children.append(node)
    masked: Any = reg.mask(node)
    assert type(masked) is Node
    assert masked.label == MASK
    assert masked.children == [CIRCULAR_REFERENCE]
    assert node.label == S and node.children[0] is node


def test_k1_str_subclasses_are_masked_and_kept_when_clean(reg: SecretRegistry) -> None:
    class Mode(str, enum.Enum):  # noqa: UP042 (a str mixin, the case under test)
        FAST = 'fast'
        LEAKY = f'mode-{S}'

    assert reg.mask(Mode.FAST) is Mode.FAST
    assert reg.mask(Mode.LEAKY) == f'mode-{MASK}'


def test_k2_pydantic_dataclass_is_masked_like_a_dataclass(reg: SecretRegistry) -> None:
    @pydantic.dataclasses.dataclass
    class Config:
        url: str

    original = Config(f'https://u:{S}@host')
    masked: Any = reg.mask(original)
    assert type(masked) is Config
    assert masked.url == f'https://u:{MASK}@host'
    assert original.url == f'https://u:{S}@host'
    clean = Config('https://host')
    assert reg.mask(clean) is clean
