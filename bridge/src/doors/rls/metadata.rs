//! The YAML `metadata` a limit carries in envoyproxy/ratelimit's configuration, read into a
//! protobuf `Struct` at load, for the dynamic metadata of the calls that pass it (`dynamic`).
//! Apart from `dynamic`, which reads the limits' units: the configuration's loading and the
//! answer's making each use one side.

use super::proto::{Kind, ListValue, Struct, Value};
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
