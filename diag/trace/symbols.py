"""String interning: every name is stored once and referred to by an integer id.

A trace repeats the same few thousand kernel and operator names hundreds of
thousands of times; the event table keeps int32 ids and this table keeps the strings.
"""
from __future__ import annotations


class SymbolTable:
    __slots__ = ("_ids", "names")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def intern(self, s: str) -> int:
        i = self._ids.get(s)
        if i is None:
            i = self._ids[s] = len(self.names)
            self.names.append(s)
        return i

    @classmethod
    def of(cls, ids: dict) -> "SymbolTable":
        """A table of the strings of ids (string -> id, numbered 0, 1, ... in insertion order,
        as chunks.codes_of makes them), taking the dict over."""
        table = cls()
        table._ids, table.names = ids, list(ids)
        return table

    def intern_many(self, strings) -> list[int]:
        """Ids of many strings. Two C-level passes (dict.fromkeys, map) instead of a Python
        loop: this runs once per event of every trace."""
        strings = strings if isinstance(strings, list) else list(strings)
        ids, names = self._ids, self.names
        for s in dict.fromkeys(strings):
            if s not in ids:
                ids[s] = len(names)
                names.append(s)
        return list(map(ids.__getitem__, strings))

    def id_of(self, s: str) -> int:
        return self._ids.get(s, -1)

    def __getitem__(self, i: int) -> str:
        return self.names[i]

    def __len__(self) -> int:
        return len(self.names)
