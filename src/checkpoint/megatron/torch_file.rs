//! `torch.save`'s format: a zip archive (`zip`) whose `<prefix>/data.pkl` pickles the object
//! (`pickle`) and refers to each tensor's storage by key, its bytes in `<prefix>/data/<key>`.
//! Tensors are read as f32 from f32, bf16, f16 or f64 storages; a tensor's size, offset and
//! strides are checked against its storage, and a tensor never holds more elements than its
//! storage does, so a crafted file cannot size an allocation beyond its own bytes.
//!
//! The writer saves a dict of strings, numbers, argument namespaces and f32 or bf16 tensors, as
//! `torch.load` reads it (`convert --save-megatron`).

use super::pickle::{Id, Node, Pickle, Writer};
use super::zip::{self, ZipWriter};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A file (or a slice of one) in `torch.save`'s format, parsed down to its pickle.
pub struct TorchFile<'a> {
    bytes: &'a [u8],
    entries: Vec<zip::Entry>,
    prefix: String,
    pub pickle: Pickle,
    pub path: PathBuf,
}

/// A tensor read as f32.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Element types of the storages read: (PyTorch's storage class, bytes per element).
const STORAGES: [(&str, usize); 4] =
    [("FloatStorage", 4), ("BFloat16Storage", 2), ("HalfStorage", 2), ("DoubleStorage", 8)];

fn element(class: &str, bytes: &[u8]) -> f32 {
    match class {
        "FloatStorage" => f32::from_le_bytes(bytes.try_into().expect("4 bytes")),
        "BFloat16Storage" => f32::from_bits((u16::from_le_bytes(bytes.try_into().expect("2 bytes")) as u32) << 16),
        "HalfStorage" => crate::checkpoint::hf_files::f16_to_f32(u16::from_le_bytes(bytes.try_into().expect("2"))),
        _ => f64::from_le_bytes(bytes.try_into().expect("8 bytes")) as f32,
    }
}

impl<'a> TorchFile<'a> {
    /// Parses `bytes`, read from `path` (named in errors).
    pub fn parse(bytes: &'a [u8], path: &Path) -> Result<TorchFile<'a>> {
        let entries = zip::entries(bytes, path)?;
        let pkl = entries.iter().find(|e| e.name.ends_with("data.pkl") && e.name.matches('/').count() <= 1);
        let pkl = pkl.ok_or_else(|| Error::format(path, "no data.pkl: not a file torch.save wrote"))?;
        let prefix = pkl.name[..pkl.name.len() - "data.pkl".len()].to_string();
        let pickle = Pickle::parse(&bytes[pkl.data.clone()], &path.join(&pkl.name))?;
        Ok(TorchFile { bytes, entries, prefix, pickle, path: path.to_path_buf() })
    }

    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::format(&self.path, what.to_string())
    }

    /// Whether `id` is a tensor (`_rebuild_tensor_v2`, or a parameter around one).
    pub fn is_tensor(&self, id: Id) -> bool {
        let p = &self.pickle;
        matches!(p.class(id), Some(("torch._utils", "_rebuild_tensor_v2" | "_rebuild_parameter")))
    }

    /// The tensor at `id`, as f32; `what` names it in errors.
    pub fn tensor(&self, id: Id, what: &str) -> Result<Tensor> {
        let p = &self.pickle;
        let bad = |problem: &str| self.err(format!("tensor '{what}': {problem}"));
        let Node::Object { args, .. } = p.node(id) else { return Err(bad("not a tensor")) };
        let args = p.items(*args).ok_or_else(|| bad("no arguments"))?;
        if p.class(id) == Some(("torch._utils", "_rebuild_parameter")) {
            let inner = *args.first().ok_or_else(|| bad("a parameter without its data"))?;
            if !matches!(p.class(inner), Some(("torch._utils", "_rebuild_tensor_v2"))) {
                return Err(bad("a parameter whose data is not a tensor"));
            }
            return self.tensor(inner, what);
        }
        if p.class(id) != Some(("torch._utils", "_rebuild_tensor_v2")) || args.len() < 4 {
            return Err(bad("not a plain tensor (_rebuild_tensor_v2 with storage, offset, size and stride)"));
        }
        let Node::Persistent(pid) = p.node(args[0]) else { return Err(bad("its storage is not a reference")) };
        let pid = p.items(*pid).ok_or_else(|| bad("a malformed storage reference"))?;
        let (class, key) = match pid {
            [kind, class, key, _location, _numel] if p.str(*kind) == Some("storage") => (*class, *key),
            _ => return Err(bad("a storage reference other than ('storage', type, key, location, numel)")),
        };
        let Node::Global { module, name } = p.node(class) else { return Err(bad("a storage without its type")) };
        let size = STORAGES.iter().find(|(n, _)| n == name && module == "torch").map(|&(_, s)| s);
        let size = size.ok_or_else(|| bad(&format!("a {module}.{name}; f32, bf16, f16 and f64 tensors are read")))?;
        let key = p.str(key).ok_or_else(|| bad("a storage key that is not a string"))?;
        let entry_name = format!("{}data/{key}", self.prefix);
        let entry = self.entries.iter().find(|e| e.name == entry_name);
        let storage =
            &self.bytes[entry.ok_or_else(|| bad(&format!("its storage {entry_name} is missing")))?.data.clone()];
        let numel = storage.len() / size;
        let offset = p.int(args[1]).and_then(|v| usize::try_from(v).ok()).ok_or_else(|| bad("a malformed offset"))?;
        let shape = p.usizes(args[2]).ok_or_else(|| bad("a malformed size"))?;
        let stride = p.usizes(args[3]).ok_or_else(|| bad("a malformed stride"))?;
        if shape.len() != stride.len() {
            return Err(bad("size and stride of different lengths"));
        }
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let last = shape.iter().zip(&stride).try_fold(offset, |a, (&d, &s)| {
            if d == 0 {
                Some(a)
            } else {
                (d - 1).checked_mul(s).and_then(|x| a.checked_add(x))
            }
        });
        match (count, last) {
            (Some(c), Some(l)) if c <= numel && (c == 0 || l < numel) => {}
            _ => {
                return Err(bad(&format!(
                    "size {shape:?}, stride {stride:?} and offset {offset} reach past its storage of {numel} elements"
                )))
            }
        }
        let count = count.expect("checked above");
        let mut data = Vec::with_capacity(count);
        let mut index = vec![0usize; shape.len()];
        for _ in 0..count {
            let at = offset + index.iter().zip(&stride).map(|(i, s)| i * s).sum::<usize>();
            data.push(element(name, &storage[at * size..(at + 1) * size]));
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(Tensor { shape, data })
    }
}

/// A value `save` writes.
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// An `argparse.Namespace` of these values.
    Namespace(Vec<(String, Value)>),
    Dict(Vec<(String, Value)>),
    List(Vec<Value>),
    /// A tensor with its shape, stored as bf16 when `bf16`, else f32.
    Tensor {
        shape: Vec<usize>,
        data: Vec<f32>,
        bf16: bool,
    },
}

/// Rounds `x` to bf16 (to nearest, ties to even), as PyTorch's `.bfloat16()` does.
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

struct Saver {
    w: Writer,
    storages: Vec<Vec<u8>>,
}

impl Saver {
    fn value(&mut self, v: &Value) {
        match v {
            Value::None => self.w.none(),
            Value::Bool(b) => self.w.bool(*b),
            Value::Int(i) => self.w.int(*i),
            Value::Float(f) => self.w.float(*f),
            Value::Str(s) => self.w.str(s),
            Value::Dict(entries) => self.dict(entries),
            Value::List(items) => {
                self.w.empty_list();
                if !items.is_empty() {
                    self.w.mark();
                    items.iter().for_each(|v| self.value(v));
                    self.w.appends();
                }
            }
            Value::Namespace(entries) => {
                self.w.global("argparse", "Namespace");
                self.w.mark();
                self.w.tuple();
                self.w.new_obj();
                self.dict(entries);
                self.w.build();
            }
            Value::Tensor { shape, data, bf16 } => self.tensor(shape, data, *bf16),
        }
    }

    fn dict(&mut self, entries: &[(String, Value)]) {
        self.w.empty_dict();
        if entries.is_empty() {
            return;
        }
        self.w.mark();
        for (k, v) in entries {
            self.w.str(k);
            self.value(v);
        }
        self.w.set_items();
    }

    fn tensor(&mut self, shape: &[usize], data: &[f32], bf16: bool) {
        let key = self.storages.len();
        let bytes: Vec<u8> = if bf16 {
            data.iter().flat_map(|&x| bf16_bits(x).to_le_bytes()).collect()
        } else {
            data.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        self.storages.push(bytes);
        let w = &mut self.w;
        w.global("torch._utils", "_rebuild_tensor_v2");
        w.mark();
        w.mark();
        w.str("storage");
        w.global("torch", if bf16 { "BFloat16Storage" } else { "FloatStorage" });
        w.str(&key.to_string());
        w.str("cpu");
        w.int(data.len() as i64);
        w.tuple();
        w.persistent_id();
        w.int(0);
        w.int_tuple(shape);
        let mut stride = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            stride[d] = stride[d + 1] * shape[d + 1];
        }
        w.int_tuple(&stride);
        w.bool(false);
        w.global("collections", "OrderedDict");
        w.mark();
        w.tuple();
        w.reduce();
        w.tuple();
        w.reduce();
    }
}

/// `value` in `torch.save`'s format, its archive prefix `name` (PyTorch uses the file's stem).
pub fn save(value: &Value, name: &str) -> Vec<u8> {
    let mut s = Saver { w: Writer::new(), storages: Vec::new() };
    s.value(value);
    let mut z = ZipWriter::new();
    z.add(&format!("{name}/data.pkl"), &s.w.finish());
    z.add(&format!("{name}/byteorder"), b"little");
    for (key, bytes) in s.storages.iter().enumerate() {
        z.add(&format!("{name}/data/{key}"), bytes);
    }
    z.add(&format!("{name}/version"), b"3\n");
    z.add(&format!("{name}/.data/serialization_id"), b"0000000000000000000000000000000000000000");
    z.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_tensors_read_back() {
        let v = Value::Dict(vec![
            ("w".into(), Value::Tensor { shape: vec![2, 3], data: vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0], bf16: true }),
            ("b".into(), Value::Tensor { shape: vec![3], data: vec![0.1, 0.2, 0.3], bf16: false }),
            ("args".into(), Value::Namespace(vec![("num_layers".into(), Value::Int(2))])),
        ]);
        let bytes = save(&v, "archive");
        let f = TorchFile::parse(&bytes, Path::new("t.pt")).unwrap();
        let p = &f.pickle;
        let w = f.tensor(p.get(p.root, "w").unwrap(), "w").unwrap();
        assert_eq!(w, Tensor { shape: vec![2, 3], data: vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0] });
        let b = f.tensor(p.get(p.root, "b").unwrap(), "b").unwrap();
        assert_eq!(b.data, [0.1, 0.2, 0.3]);
        let args = p.get(p.root, "args").unwrap();
        assert_eq!(p.int(p.get(args, "num_layers").unwrap()), Some(2));
        assert_eq!(bf16_bits(1.0 + f32::EPSILON), 0x3f80);
        assert_eq!(bf16_bits(-2.0), 0xc000);
    }
}
