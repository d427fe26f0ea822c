//! envoyproxy/ratelimit's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`, the bridge's
//! `--rls-dynamic-metadata`): what Envoy's `ratelimit` filter puts under its own name for
//! access logs and later filters to read. The call's `domain`, its `descriptors` (each
//! `entries` as `key=value`, its `limit` override, its `hitsAddend`), the request's
//! `hitsAddend`, and the `metadata` of every limit its descriptor passed, merged: the
//! shapes that service gives them, so what reads them keeps working. Also the YAML
//! `metadata` a limit carries, read into a `Struct` at load.

use super::limits::unit_name;
use super::proto::{Kind, ListValue, RateLimitDescriptor, RateLimitRequest, Struct, Value};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// A descriptor's `metadata`: a map of any YAML, as envoyproxy/ratelimit reads it.
pub fn yaml_metadata<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Struct>, D::Error> {
    let map: Option<BTreeMap<String, serde_yaml_ng::Value>> = Option::deserialize(d)?;
    map.map(|map| to_struct(&map))
        .transpose()
        .map_err(serde::de::Error::custom)
}

fn to_struct(map: &BTreeMap<String, serde_yaml_ng::Value>) -> Result<Struct, String> {
    let fields = map.iter().map(|(k, v)| Ok((k.clone(), to_value(v)?)));
    Ok(Struct {
        fields: fields.collect::<Result<_, String>>()?,
    })
}

fn to_value(yaml: &serde_yaml_ng::Value) -> Result<Value, String> {
    use serde_yaml_ng::Value as Yaml;
    let kind = match yaml {
        Yaml::Null => Kind::Null(0),
        Yaml::Bool(b) => Kind::Bool(*b),
        Yaml::Number(n) => Kind::Number(n.as_f64().unwrap_or(f64::NAN)),
        Yaml::String(s) => Kind::String(s.clone()),
        Yaml::Sequence(list) => Kind::List(ListValue {
            values: list.iter().map(to_value).collect::<Result<_, String>>()?,
        }),
        Yaml::Mapping(map) => {
            let mut fields = BTreeMap::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Number(n) => n.to_string(),
                    Yaml::Bool(b) => b.to_string(),
                    _ => return Err(format!("metadata: a key is not text: {k:?}")),
                };
                fields.insert(key, to_value(v)?);
            }
            Kind::Struct(Struct { fields })
        }
        Yaml::Tagged(tagged) => return to_value(&tagged.value),
    };
    Ok(Value::of(kind))
}

/// The dynamic metadata of `request`, whose descriptors `passed` (by index) carry the
/// limits' `metadata`, merged in their order.
pub fn of(request: &RateLimitRequest, passed: &[&Struct]) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".into(), Value::string(request.domain.clone()));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    let list = ListValue {
        values: descriptors,
    };
    fields.insert("descriptors".into(), Value::of(Kind::List(list)));
    if request.hits_addend != 0 {
        let hits = Kind::Number(f64::from(request.hits_addend));
        fields.insert("hitsAddend".into(), Value::of(hits));
    }
    let mut metadata = Struct::default();
    for limit in passed {
        merge(&mut metadata, limit);
    }
    if !metadata.fields.is_empty() {
        fields.insert("metadata".into(), Value::of(Kind::Struct(metadata)));
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let entries = d.entries.iter().map(|e| {
        let entry = format!("{}={}", e.key, e.value);
        Value::string(entry)
    });
    let mut fields = BTreeMap::new();
    let list = ListValue {
        values: entries.collect(),
    };
    fields.insert("entries".into(), Value::of(Kind::List(list)));
    if let Some(limit) = &d.limit {
        // As Go prints the message: `requests_per_unit:10 unit:MINUTE`.
        let unit = unit_name(limit.unit).map_or_else(|| limit.unit.to_string(), str::to_uppercase);
        let text = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
        fields.insert("limit".into(), Value::string(text));
    }
    if let Some(hits) = &d.hits_addend {
        // A JSON number, as theirs: exact up to 2^53.
        #[allow(clippy::cast_precision_loss)]
        let hits = Kind::Number(hits.value as f64);
        fields.insert("hitsAddend".into(), Value::of(hits));
    }
    Value::of(Kind::Struct(Struct { fields }))
}

/// `from` merged into `into` as envoyproxy/ratelimit merges: structs field by field, and
/// otherwise the first limit's value stays.
fn merge(into: &mut Struct, from: &Struct) {
    for (key, value) in &from.fields {
        match (into.fields.get_mut(key), &value.kind) {
            (None, _) => {
                into.fields.insert(key.clone(), value.clone());
            }
            (Some(there), Some(Kind::Struct(more))) => {
                if let Some(Kind::Struct(mine)) = &mut there.kind {
                    merge(mine, more);
                }
            }
            (Some(_), _) => {}
        }
    }
}
