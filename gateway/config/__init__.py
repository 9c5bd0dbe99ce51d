"""The gateway's configuration: pydantic models for the TOML file, one module per section. Defaults live
in the section modules.

Every key is documented with a comment in `config/gateway.example.toml`. Unknown keys are refused so a
typo never silently falls back to a default. Import from here (`from gateway.config import Config`): the
package re-exports every public name of its modules.
"""

from gateway.config.auth import (
    ApiKey,
    AuthConfig,
    AuthLimits,
    AuthMode,
    AuthRule,
    ClaimValue,
    IntrospectionConfig,
    JwtConfig,
    check_claims,
)
from gateway.config.events import CaptureRule, EventsConfig, default_rules
from gateway.config.file import (
    Config,
    ConfigError,
    ConfigUnreadable,
    describe_errors,
    load_config,
    parse_config,
    read_config_bytes,
    unknown_key,
)
from gateway.config.listen import parse_listen, url_host
from gateway.config.logging import LoggingConfig
from gateway.config.retention import RetentionConfig
from gateway.config.section import MiB
from gateway.config.server import ResumeConfig, ServerConfig
from gateway.config.store import StoreConfig
from gateway.config.tasks import (
    MODERN_FOR_TASK_SUPPORT,
    UNMATCHED_TOOL,
    ModernTasks,
    TasksConfig,
    TaskSupport,
    ToolTaskPolicy,
)
from gateway.config.telemetry import TelemetryConfig
from gateway.config.ui import UI_PATH, UiConfig, ui_problems
from gateway.config.upstream import (
    DEFAULT_UPSTREAM,
    UPSTREAM_NAME,
    BridgeConfig,
    HttpUpstreamConfig,
    ReadinessConfig,
    StdioConfig,
    UpstreamAuthConfig,
    UpstreamConfig,
)
from gateway.config.upstreams import KeyProblems, route_config, upstream_path

__all__ = [
    "DEFAULT_UPSTREAM",
    "MODERN_FOR_TASK_SUPPORT",
    "UI_PATH",
    "UNMATCHED_TOOL",
    "UPSTREAM_NAME",
    "ApiKey",
    "AuthConfig",
    "AuthLimits",
    "AuthMode",
    "AuthRule",
    "BridgeConfig",
    "CaptureRule",
    "ClaimValue",
    "Config",
    "ConfigError",
    "ConfigUnreadable",
    "EventsConfig",
    "HttpUpstreamConfig",
    "IntrospectionConfig",
    "JwtConfig",
    "KeyProblems",
    "LoggingConfig",
    "MiB",
    "ModernTasks",
    "ReadinessConfig",
    "ResumeConfig",
    "RetentionConfig",
    "ServerConfig",
    "StdioConfig",
    "StoreConfig",
    "TaskSupport",
    "TasksConfig",
    "TelemetryConfig",
    "ToolTaskPolicy",
    "UiConfig",
    "UpstreamAuthConfig",
    "UpstreamConfig",
    "check_claims",
    "default_rules",
    "describe_errors",
    "load_config",
    "parse_config",
    "parse_listen",
    "read_config_bytes",
    "route_config",
    "ui_problems",
    "unknown_key",
    "upstream_path",
    "url_host",
]
