"""Built-in output plugins, by the name ``pgcdc tail -P`` takes.

- ``test_decoding`` (`test_decoding.TestDecoding`): the server's contrib test_decoding text.
- ``wal2json`` (`wal2json.Wal2Json`): wal2json's format versions 1 and 2.
- ``json`` (`json_envelope.JsonEnvelope`): pgcdc's change envelope, one JSON object per line.
"""
