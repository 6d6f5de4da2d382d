//! How far a rule group's YAML grows with its aliases expanded, measured
//! before the group is read into values.
//!
//! An alias repeats its anchor's node wherever it stands, and reading the
//! group copies each repetition: 92 KB of one 64 KiB scalar and 2,000
//! aliases to it read as 131 MB, taking 1.2 s and 1.2 GB of memory in a
//! release build, and would have been written out as much again for the
//! ruler. The YAML reader bounds only the number of alias jumps (a
//! hundred per event), not what they copy. Walking the events first,
//! charging each scalar's bytes as it is replayed and copying nothing,
//! stops such a group once it passes its allowance.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess};
use serde::de::{VariantAccess, Visitor};

/// What a group may grow to, as a multiple of its size: aliases that
/// reuse a label set across rules stay well within it.
const GROWTH: usize = 4;
/// What any group may grow to, however small.
const FLOOR: usize = 64 * 1024;

/// Refuses a group whose scalars, with every alias expanded, come to more
/// than its allowance (each node counts a byte more than its text).
pub fn check(body: &[u8]) -> Result<(), String> {
    let allowance = body.len().saturating_mul(GROWTH).max(FLOOR);
    let walk = Walk {
        left: &Cell::new(allowance),
        allowance,
    };
    walk.deserialize(serde_yaml_ng::Deserializer::from_slice(body))
        .map_err(|e| e.to_string())
}

/// Visits every node, replayed aliases among them, keeping nothing.
#[derive(Clone, Copy)]
struct Walk<'a> {
    left: &'a Cell<usize>,
    allowance: usize,
}

impl Walk<'_> {
    fn charge<E: de::Error>(self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(bytes.saturating_add(1)) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "its aliases expand it past {} bytes ({GROWTH} times its size, at least \
                 {FLOOR}); write the repeated parts out",
                self.allowance
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, node: D) -> Result<(), D::Error> {
        node.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        self.charge(text.len())
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<(), E> {
        self.charge(bytes.len())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.charge(0)
    }

    fn visit_some<D: Deserializer<'de>>(self, node: D) -> Result<(), D::Error> {
        self.deserialize(node)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, node: D) -> Result<(), D::Error> {
        self.deserialize(node)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        self.charge::<A::Error>(0)?;
        while items.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        self.charge::<A::Error>(0)?;
        while entries.next_key_seed(self)?.is_some() {
            entries.next_value_seed(self)?;
        }
        Ok(())
    }

    /// A tagged node: its tag, then the node.
    fn visit_enum<A: EnumAccess<'de>>(self, tagged: A) -> Result<(), A::Error> {
        let ((), node) = tagged.variant_seed(self)?;
        node.newtype_variant_seed(self)
    }
}
