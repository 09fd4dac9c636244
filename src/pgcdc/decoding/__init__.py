"""The output plugin API in Python, fed by pgoutput: plugins, their context, the assembler.

See `plugin` for the callbacks and their rules, `context` for what a callback gets besides
its arguments, `assembler` for how the message stream becomes callbacks, and `runner` for
running a plugin on a slot.
"""

from pgcdc.decoding.assembler import AssemblerStats, TransactionAssembler
from pgcdc.decoding.catalog import Catalog, quote_identifier
from pgcdc.decoding.context import DecodingContext, OutputWrite, parse_bool_option
from pgcdc.decoding.model import Change, ChangeAction, Transaction, Truncation
from pgcdc.decoding.plugin import (
    BUILTIN_PLUGINS,
    OutputPlugin,
    OutputPluginOptions,
    OutputType,
    PluginCapabilities,
    capabilities,
    load_plugin,
)
from pgcdc.decoding.runner import PluginRunner
from pgcdc.decoding.spill import DEFAULT_MEMORY_LIMIT, SpillBuffer, SpillPool

__all__ = [
    "BUILTIN_PLUGINS",
    "DEFAULT_MEMORY_LIMIT",
    "AssemblerStats",
    "Catalog",
    "Change",
    "ChangeAction",
    "DecodingContext",
    "OutputPlugin",
    "OutputPluginOptions",
    "OutputType",
    "OutputWrite",
    "PluginCapabilities",
    "PluginRunner",
    "SpillBuffer",
    "SpillPool",
    "Transaction",
    "TransactionAssembler",
    "Truncation",
    "capabilities",
    "load_plugin",
    "parse_bool_option",
    "quote_identifier",
]
