"""The environment protocol: observations, the response parser, the base env, the registry."""

from vagen.env.base import INFO_KEYS, ActionResult, LanguageEnv
from vagen.env.observation import IMAGE_PLACEHOLDER, OBSERVATION_MODES, Observation
from vagen.env.parsing import RESPONSE_FORMATS, ParsedResponse, match_actions, parse_response
from vagen.env.registry import make_env, register_env, registered_envs

__all__ = [
    "IMAGE_PLACEHOLDER",
    "INFO_KEYS",
    "OBSERVATION_MODES",
    "RESPONSE_FORMATS",
    "ActionResult",
    "LanguageEnv",
    "Observation",
    "ParsedResponse",
    "make_env",
    "match_actions",
    "parse_response",
    "register_env",
    "registered_envs",
]
