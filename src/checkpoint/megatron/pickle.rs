//! Python's pickle, protocols 2 to 5, as far as PyTorch's files use it: `torch.save`'s `data.pkl`
//! and `torch.distributed.checkpoint`'s `.metadata`. Nothing is executed: a class or function a
//! pickle names stays a name (`Node::Global`), and calling it (`REDUCE`, `NEWOBJ`) or setting its
//! state (`BUILD`) is recorded as an `Node::Object` for the reader above to interpret. Values live
//! in one arena and refer to each other by index, so the memo and later mutation (a dict filled
//! after it is memoized) behave as in Python, and every opcode adds at most one node: a file
//! cannot make the reader allocate more nodes than it has bytes, nor any string longer than what
//! follows it in the file.
//!
//! `Writer` emits the same subset (protocol 2), for `convert --save-megatron`.

use crate::error::{Error, Result};
use std::path::Path;

pub type Id = usize;

/// One Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    /// A set or frozenset.
    Set(Vec<Id>),
    /// `module.name`: a class or function, never imported.
    Global {
        module: String,
        name: String,
    },
    /// `callable(*args)` (REDUCE) or `callable.__new__(callable, *args)` (NEWOBJ), with the state
    /// a BUILD gave it.
    Object {
        callable: Id,
        args: Id,
        state: Option<Id>,
    },
    /// A persistent id (PyTorch's reference to a tensor storage).
    Persistent(Id),
    /// The stack marker of MARK (never reachable from the root).
    Mark,
}

/// A parsed pickle: its nodes and the root value.
pub struct Pickle {
    pub nodes: Vec<Node>,
    pub root: Id,
}

/// Longest integer a LONG1 or LONG4 opcode may carry here: 8 bytes, an i64.
const MAX_LONG: usize = 8;

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, Id>,
}

impl<'a> Parser<'a> {
    fn err(&self, problem: impl std::fmt::Display) -> Error {
        Error::format(self.path, format!("pickle at byte {}: {problem}", self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| self.err(format!("{n} bytes needed, {} left", self.bytes.len() - self.pos)))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn uint(&mut self, n: usize) -> Result<u64> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    /// A length field of `n` bytes, checked against the bytes that follow it.
    fn len(&mut self, n: usize) -> Result<usize> {
        let v = self.uint(n)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if v > left {
            return Err(self.err(format!("a length of {v} bytes with {left} left")));
        }
        Ok(v as usize)
    }

    fn line(&mut self) -> Result<&'a str> {
        let rest = &self.bytes[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or_else(|| self.err("a line without its newline"))?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| self.err("a line that is not UTF-8"))?;
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, node: Node) -> Id {
        self.nodes.push(node);
        let id = self.nodes.len() - 1;
        self.stack.push(id);
        id
    }

    fn pop(&mut self) -> Result<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("an opcode pops an empty stack"));
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> Result<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("an opcode needs a value on an empty stack"));
        }
        Ok(*self.stack.last().expect("checked above"))
    }

    /// The values since the last MARK, removing them and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Id>> {
        let at = self.marks.pop().ok_or_else(|| self.err("no MARK to pop to"))?;
        Ok(self.stack.split_off(at))
    }

    fn str(&mut self, n: usize) -> Result<Node> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| self.err("a string that is not UTF-8"))?;
        Ok(Node::Str(s.to_string()))
    }

    fn memo_put(&mut self, index: u64) -> Result<()> {
        let id = self.top()?;
        self.memo.insert(index, id);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<()> {
        let id = self.memo.get(&index).copied();
        let id = id.ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.stack.push(id);
        Ok(())
    }

    /// Adds `items` (key, value, key, value, ...) to the dict at `target`.
    fn set_items(&mut self, target: Id, items: Vec<Id>) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("SETITEMS with an odd number of values"));
        }
        let Node::Dict(d) = &mut self.nodes[target] else { return Err(self.err("SETITEM(S) on a value not a dict")) };
        d.extend(items.chunks(2).map(|kv| (kv[0], kv[1])));
        Ok(())
    }

    fn append(&mut self, target: Id, items: Vec<Id>) -> Result<()> {
        match &mut self.nodes[target] {
            Node::List(l) | Node::Set(l) => l.extend(items),
            _ => return Err(self.err("APPEND(S) or ADDITEMS on a value not a list or set")),
        }
        Ok(())
    }

    /// REDUCE and NEWOBJ: an `OrderedDict()` becomes a dict, so SETITEMS fills it.
    fn call(&mut self, callable: Id, args: Id) -> Node {
        let empty_args = matches!(&self.nodes[args], Node::Tuple(t) if t.is_empty());
        let is_dict = matches!(&self.nodes[callable], Node::Global { module, name }
            if module == "collections" && (name == "OrderedDict" || name == "defaultdict"));
        if is_dict && empty_args {
            Node::Dict(Vec::new())
        } else {
            Node::Object { callable, args, state: None }
        }
    }

    fn build(&mut self) -> Result<()> {
        let state = self.pop()?;
        let target = self.top()?;
        match &mut self.nodes[target] {
            Node::Object { state: s, .. } => *s = Some(state),
            // An OrderedDict's own attributes (a state dict's `_metadata`) are not its items.
            Node::Dict(_) => {}
            _ => return Err(self.err("BUILD on a value that is not an object")),
        }
        Ok(())
    }

    fn global(&mut self, module: String, name: String) -> Id {
        self.push(Node::Global { module, name })
    }

    fn long(&mut self, n: usize) -> Result<Node> {
        if n > MAX_LONG {
            return Err(self.err(format!("an integer of {n} bytes (at most {MAX_LONG} are read)")));
        }
        let b = self.take(n)?;
        let mut v: i64 = if b.last().is_some_and(|&x| x & 0x80 != 0) { -1 } else { 0 };
        for &x in b.iter().rev() {
            v = (v << 8) | x as i64;
        }
        Ok(Node::Int(v))
    }

    fn tuple(&mut self, n: usize) -> Result<()> {
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.pop()?);
        }
        items.reverse();
        self.push(Node::Tuple(items));
        Ok(())
    }

    /// The value a value opcode makes (None, booleans, numbers, strings, bytes); None for any
    /// other opcode.
    fn atom(&mut self, op: u8) -> Result<Option<Node>> {
        let node = match op {
            b'N' => Node::None,
            0x88 | 0x89 => Node::Bool(op == 0x88),
            b'J' => Node::Int(self.uint(4)? as u32 as i32 as i64),
            b'K' => Node::Int(self.uint(1)? as i64),
            b'M' => Node::Int(self.uint(2)? as i64),
            0x8a => {
                let n = self.uint(1)? as usize;
                self.long(n)?
            }
            0x8b => {
                let n = self.len(4)?;
                self.long(n)?
            }
            b'G' => Node::Float(f64::from_bits(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))),
            b'X' | 0x8c | 0x8d => {
                let n = self.len(match op {
                    b'X' => 4,
                    0x8c => 1,
                    _ => 8,
                })?;
                self.str(n)?
            }
            b'B' | b'C' | 0x8e | 0x96 | b'T' | b'U' => {
                let n = self.len(match op {
                    b'C' | b'U' => 1,
                    b'B' | b'T' => 4,
                    _ => 8,
                })?;
                Node::Bytes(self.take(n)?.to_vec())
            }
            b')' => Node::Tuple(Vec::new()),
            b']' => Node::List(Vec::new()),
            b'}' => Node::Dict(Vec::new()),
            0x8f => Node::Set(Vec::new()),
            _ => return Ok(None),
        };
        Ok(Some(node))
    }

    /// The memo opcodes; false for any other.
    fn memo_op(&mut self, op: u8) -> Result<bool> {
        match op {
            b'q' | b'r' => {
                let i = self.uint(if op == b'q' { 1 } else { 4 })?;
                self.memo_put(i)?;
            }
            0x94 => {
                let i = self.memo.len() as u64;
                self.memo_put(i)?;
            }
            b'h' | b'j' => {
                let i = self.uint(if op == b'h' { 1 } else { 4 })?;
                self.memo_get(i)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Runs one opcode; `Ok(false)` at STOP.
    fn step(&mut self) -> Result<bool> {
        let op = self.take(1)?[0];
        if let Some(node) = self.atom(op)? {
            self.push(node);
            return Ok(true);
        }
        if self.memo_op(op)? {
            return Ok(true);
        }
        match op {
            0x80 => {
                let v = self.take(1)?[0];
                if !(2..=5).contains(&v) {
                    return Err(self.err(format!("pickle protocol {v} (2 to 5 are read)")));
                }
            }
            0x95 => {
                self.uint(8)?; // FRAME: its length only groups opcodes
            }
            b'.' => return Ok(false),
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let id = self.top()?;
                self.stack.push(id);
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items));
            }
            0x85..=0x87 => self.tuple((op - 0x84) as usize)?,
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Node::List(items));
            }
            b'a' => {
                let v = self.pop()?;
                let target = self.top()?;
                self.append(target, vec![v])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                let target = self.top()?;
                self.append(target, items)?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                let id = self.push(Node::Dict(Vec::new()));
                self.set_items(id, items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let target = self.top()?;
                self.set_items(target, vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                let target = self.top()?;
                self.set_items(target, items)?;
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Node::Set(items));
            }
            _ => self.object_op(op)?,
        }
        Ok(true)
    }

    /// GLOBAL, STACK_GLOBAL, REDUCE, NEWOBJ(_EX), BUILD and BINPERSID: names and objects.
    fn object_op(&mut self, op: u8) -> Result<()> {
        match op {
            b'c' => {
                let module = self.line()?.to_string();
                let name = self.line()?.to_string();
                self.global(module, name);
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Node::Str(m), Node::Str(n)) = (&self.nodes[module], &self.nodes[name]) else {
                    return Err(self.err("STACK_GLOBAL of values that are not strings"));
                };
                let (m, n) = (m.clone(), n.clone());
                self.global(m, n);
            }
            b'R' | 0x81 | 0x92 => {
                if op == 0x92 {
                    self.pop()?; // NEWOBJ_EX's keyword arguments
                }
                let args = self.pop()?;
                let callable = self.pop()?;
                let node = self.call(callable, args);
                self.push(node);
            }
            b'b' => self.build()?,
            b'Q' => {
                let pid = self.pop()?;
                self.push(Node::Persistent(pid));
            }
            other => return Err(self.err(format!("opcode 0x{other:02x}, which PyTorch's files do not use"))),
        }
        Ok(())
    }
}

impl Pickle {
    /// Parses `bytes` (read from `path`, named in errors).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Pickle> {
        let mut p = Parser {
            bytes,
            pos: 0,
            path,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Default::default(),
        };
        while p.step()? {}
        if !p.marks.is_empty() || p.stack.len() != 1 {
            return Err(p.err(format!("STOP with {} values and {} marks on the stack", p.stack.len(), p.marks.len())));
        }
        let root = p.stack[0];
        Ok(Pickle { nodes: p.nodes, root })
    }

    pub fn node(&self, id: Id) -> &Node {
        &self.nodes[id]
    }

    pub fn str(&self, id: Id) -> Option<&str> {
        match &self.nodes[id] {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn int(&self, id: Id) -> Option<i64> {
        match self.nodes[id] {
            Node::Int(v) => Some(v),
            Node::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// A tuple's or list's items (a `torch.Size`'s too).
    pub fn items(&self, id: Id) -> Option<&[Id]> {
        match &self.nodes[id] {
            Node::Tuple(v) | Node::List(v) => Some(v),
            Node::Object { callable, args, .. } if self.is_global(*callable, "torch", "Size") => {
                self.items(*args).and_then(|a| a.first()).and_then(|&inner| match &self.nodes[inner] {
                    Node::Tuple(v) | Node::List(v) => Some(v.as_slice()),
                    _ => None,
                })
            }
            _ => None,
        }
    }

    /// A tuple or list of whole numbers, each at least 0.
    pub fn usizes(&self, id: Id) -> Option<Vec<usize>> {
        self.items(id)?.iter().map(|&i| self.int(i).and_then(|v| usize::try_from(v).ok())).collect()
    }

    pub fn is_global(&self, id: Id, module: &str, name: &str) -> bool {
        matches!(&self.nodes[id], Node::Global { module: m, name: n } if m == module && n == name)
    }

    /// A dict's entries; an object's (its BUILD state's, for a dataclass or a Namespace).
    pub fn entries(&self, id: Id) -> Option<&[(Id, Id)]> {
        match &self.nodes[id] {
            Node::Dict(d) => Some(d),
            Node::Object { state: Some(s), .. } => match &self.nodes[*s] {
                Node::Dict(d) => Some(d),
                // A class with __slots__: (dict or None, slot dict).
                Node::Tuple(t) if t.len() == 2 => self.entries(t[1]).or_else(|| self.entries(t[0])),
                _ => None,
            },
            _ => None,
        }
    }

    /// The value under the string key `key` of a dict or object.
    pub fn get(&self, id: Id, key: &str) -> Option<Id> {
        self.entries(id)?.iter().find(|(k, _)| self.str(*k) == Some(key)).map(|&(_, v)| v)
    }

    /// The class of an object: `(module, name)`.
    pub fn class(&self, id: Id) -> Option<(&str, &str)> {
        let Node::Object { callable, .. } = &self.nodes[id] else { return None };
        match &self.nodes[*callable] {
            Node::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }
}

/// A protocol-2 pickle, written opcode by opcode (no memo: every value is written where it is).
#[derive(Default)]
pub struct Writer {
    pub out: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer { out: vec![0x80, 2] }
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        self.out
    }

    pub fn none(&mut self) {
        self.out.push(b'N');
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { 0x88 } else { 0x89 });
    }

    pub fn int(&mut self, v: i64) {
        if let Ok(small) = i32::try_from(v) {
            self.out.push(b'J');
            self.out.extend_from_slice(&small.to_le_bytes());
        } else {
            self.out.extend_from_slice(&[0x8a, 8]);
            self.out.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub fn float(&mut self, v: f64) {
        self.out.push(b'G');
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    pub fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    pub fn bytes(&mut self, b: &[u8]) {
        self.out.push(b'B');
        self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.out.extend_from_slice(b);
    }

    pub fn global(&mut self, module: &str, name: &str) {
        self.out.push(b'c');
        for part in [module, name] {
            self.out.extend_from_slice(part.as_bytes());
            self.out.push(b'\n');
        }
    }

    pub fn mark(&mut self) {
        self.out.push(b'(');
    }

    /// A tuple of what was written since `mark`.
    pub fn tuple(&mut self) {
        self.out.push(b't');
    }

    pub fn empty_dict(&mut self) {
        self.out.push(b'}');
    }

    pub fn empty_list(&mut self) {
        self.out.push(b']');
    }

    /// Adds the key/value pairs written since `mark` to the dict below them.
    pub fn set_items(&mut self) {
        self.out.push(b'u');
    }

    /// Appends what was written since `mark` to the list below it.
    pub fn appends(&mut self) {
        self.out.push(b'e');
    }

    /// Calls the callable below the argument tuple on top.
    pub fn reduce(&mut self) {
        self.out.push(b'R');
    }

    /// `cls.__new__(cls, *args)`, from the class and the argument tuple on top.
    pub fn new_obj(&mut self) {
        self.out.push(0x81);
    }

    /// Sets the state on top as the object's below it.
    pub fn build(&mut self) {
        self.out.push(b'b');
    }

    pub fn persistent_id(&mut self) {
        self.out.push(b'Q');
    }

    /// A tuple of whole numbers.
    pub fn int_tuple(&mut self, v: &[usize]) {
        self.mark();
        for &x in v {
            self.int(x as i64);
        }
        self.tuple();
    }

    /// A dict with string keys, each value written by `value`.
    pub fn str_dict<T>(&mut self, entries: &[(&str, T)], mut value: impl FnMut(&mut Writer, &T)) {
        self.empty_dict();
        if entries.is_empty() {
            return;
        }
        self.mark();
        for (k, v) in entries {
            self.str(k);
            value(self, v);
        }
        self.set_items();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Result<Pickle> {
        Pickle::parse(b, Path::new("t.pkl"))
    }

    #[test]
    fn reads_back_what_the_writer_writes() {
        let mut w = Writer::new();
        w.empty_dict();
        w.mark();
        w.str("n");
        w.int(-5_000_000_000);
        w.str("x");
        w.float(1.5);
        w.str("shape");
        w.int_tuple(&[2, 3]);
        w.str("obj");
        w.global("argparse", "Namespace");
        w.mark();
        w.tuple();
        w.new_obj();
        w.str_dict(&[("hidden_size", 8i64)], |w, v| w.int(*v));
        w.build();
        w.set_items();
        let p = parse(&w.finish()).unwrap();
        assert_eq!(p.int(p.get(p.root, "n").unwrap()), Some(-5_000_000_000));
        assert_eq!(p.node(p.get(p.root, "x").unwrap()), &Node::Float(1.5));
        assert_eq!(p.usizes(p.get(p.root, "shape").unwrap()), Some(vec![2, 3]));
        let obj = p.get(p.root, "obj").unwrap();
        assert_eq!(p.class(obj), Some(("argparse", "Namespace")));
        assert_eq!(p.int(p.get(obj, "hidden_size").unwrap()), Some(8));
    }

    #[test]
    fn a_memoized_dict_filled_later_is_seen_filled() {
        // {} BINPUT 0, MARK 'a' 1 SETITEMS, POP, BINGET 0, STOP
        let p = parse(b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01u0h\x00.").unwrap();
        assert_eq!(p.int(p.get(p.root, "a").unwrap()), Some(1));
    }

    #[test]
    fn malformed_pickles_are_errors() {
        for bad in [
            &b"\x80\x02X\xff\xff\xff\x7f"[..], // a string longer than the file
            b"\x80\x02h\x05.",                 // a memo index never stored
            b"\x80\x02(.",                     // STOP with a mark left
            b"\x80\x02u.",                     // SETITEMS without a mark
            b"\x80\x02K\x01K\x02.",            // two values at STOP
            b"\x80\x09N.",                     // an unknown protocol
            b"\x80\x02cos\nsystem",            // a line without its newline
            b"\x80\x02\x8a\x10",               // a 16-byte integer
            b"\x80\x02N",                      // no STOP
            b"\x80\x02Nb.",                    // BUILD on nothing
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
