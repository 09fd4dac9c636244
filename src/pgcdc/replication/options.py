"""pgoutput START_REPLICATION options, negotiated and validated against the server version.

The server checks these only after the walsender has started the plugin, and reports a wrong
combination as a bare ERROR; checking locally first gives the user one clear sentence that says
which option, which server version, and what would work.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from pgcdc.errors import UnsupportedOption
from pgcdc.protocol import MAX_PROTO_VERSION, StreamingMode
from pgcdc.replication.quoting import literal, option_identifier

__all__ = ["OriginFilter", "StreamOptions", "max_proto_version"]


class OriginFilter(StrEnum):
    """pgoutput's ``origin`` option (PG16+): `none` sends only changes made locally."""

    ANY = "any"
    NONE = "none"


def max_proto_version(server_version: int) -> int:
    """The highest pgoutput proto_version a server (``server_version_num``) supports."""
    if server_version >= 160000:
        return 4
    if server_version >= 150000:
        return 3
    if server_version >= 140000:
        return 2
    return 1


def _major(server_version: int) -> int:
    return server_version // 10000


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What the client asks pgoutput for. `proto_version=None` means the server's highest."""

    publication_names: tuple[str, ...]
    proto_version: int | None = None
    binary: bool = False
    messages: bool = False
    streaming: StreamingMode = StreamingMode.OFF
    two_phase: bool = False
    origin: OriginFilter | None = None
    #: Extra session settings (GUC name -> value) applied before START_REPLICATION.
    settings: dict[str, str] = field(default_factory=dict)

    def negotiate(self, server_version: int, *, require_publication: bool = True) -> StreamOptions:
        """These options with proto_version filled in, or UnsupportedOption naming the problem.
        (`require_publication=False`: only whether the server could send such a session.)"""
        if require_publication and not self.publication_names:
            raise UnsupportedOption("at least one publication name is required")
        major = _major(server_version)
        highest = max_proto_version(server_version)
        proto = highest if self.proto_version is None else self.proto_version
        if not 1 <= proto <= MAX_PROTO_VERSION:
            raise UnsupportedOption(f"proto_version must be 1 to {MAX_PROTO_VERSION}, got {proto}")
        if proto > highest:
            raise UnsupportedOption(
                f"PostgreSQL {major} supports pgoutput proto_version {highest} at most, "
                f"{proto} was requested"
            )

        def need(what: str, min_major: int, min_proto: int = 1) -> None:
            if major < min_major:
                raise UnsupportedOption(
                    f"{what} needs PostgreSQL {min_major} or later, the server is {major}"
                )
            if proto < min_proto:
                raise UnsupportedOption(
                    f"{what} needs proto_version {min_proto} or higher, {proto} was requested"
                )

        streaming = StreamingMode(self.streaming)
        if self.binary:
            need("binary", 14)
        if self.messages:
            need("messages", 14)
        if streaming is StreamingMode.ON:
            need("streaming", 14, 2)
        elif streaming is StreamingMode.PARALLEL:
            need("streaming 'parallel'", 16, 4)
        if self.two_phase:
            need("two_phase", 15, 3)
        if self.origin is not None:
            need("origin", 16)
        origin = None if self.origin is None else OriginFilter(self.origin)
        return replace(self, proto_version=proto, streaming=streaming, origin=origin)

    def option_pairs(self) -> list[tuple[str, str]]:
        """pgoutput's options as (name, value) pairs, for negotiated options.

        Only options that differ from pgoutput's defaults are included, so the same list works
        on servers that do not know them.
        """
        assert self.proto_version is not None, "negotiate() first"
        names = ",".join(option_identifier(name) for name in self.publication_names)
        pairs = [("proto_version", str(self.proto_version)), ("publication_names", names)]
        if self.binary:
            pairs.append(("binary", "true"))
        if self.messages:
            pairs.append(("messages", "true"))
        if self.streaming is StreamingMode.ON:
            pairs.append(("streaming", "true"))  # 'on' is PG16+ only; 'true' works on 14+
        elif self.streaming is StreamingMode.PARALLEL:
            pairs.append(("streaming", "parallel"))
        if self.two_phase:
            pairs.append(("two_phase", "true"))
        if self.origin is not None:
            pairs.append(("origin", self.origin.value))
        return pairs

    def command_options(self) -> str:
        """The option list of ``START_REPLICATION ... LOGICAL X/Y (options)``."""
        return ", ".join(f"{name} {literal(value)}" for name, value in self.option_pairs())
