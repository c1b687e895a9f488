#!/usr/bin/env python3
"""Writes src/data/unicode_classes.rs: the code-point ranges of the general categories L (letters)
and N (numbers), which the pre-tokenizers' \\p{L} and \\p{N} need, and of Lu with Lt, Ll and M,
which TikTokenizer's v2 pattern adds, from Python's unicodedata.

    python3 tools/unicode_classes.py > src/data/unicode_classes.rs
"""
import sys
import unicodedata


def ranges(categories):
    out, start, prev = [], None, None
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat in categories or cat[0] in categories:
            if start is None:
                start = cp
            elif cp != prev + 1:
                out.append((start, prev))
                start = cp
            prev = cp
    out.append((start, prev))
    return out


def table(name, doc, rs):
    lines = [f"/// {doc} ({len(rs)} inclusive ranges).", "#[rustfmt::skip]", f"pub const {name}: &[(u32, u32)] = &["]
    for i in range(0, len(rs), 6):
        lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X})," for a, b in rs[i:i + 6]))
    lines.append("];")
    return "\n".join(lines)


print(f"""//! The Unicode general categories L (letters) and N (numbers) as sorted code-point ranges, for the
//! pre-tokenizers' `\\p{{L}}` and `\\p{{N}}` (`data::pretokenize`), and Lu with Lt, Ll and M (marks) for
//! TikTokenizer's v2 pattern. Generated from Unicode
//! {unicodedata.unidata_version} by `tools/unicode_classes.py`; do not edit by hand.

/// The Unicode version of these tables.
pub const UNICODE_VERSION: &str = "{unicodedata.unidata_version}";

{table("LETTER", "General category L: Lu, Ll, Lt, Lm, Lo", ranges({"L"}))}

{table("NUMBER", "General category N: Nd, Nl, No", ranges({"N"}))}

{table("UPPER", "General categories Lu and Lt: upper- and titlecase letters", ranges({"Lu", "Lt"}))}

{table("LOWER", "General category Ll: lowercase letters", ranges({"Ll"}))}

{table("MARK", "General category M: Mn, Mc, Me", ranges({"M"}))}""")
