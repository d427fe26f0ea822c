//! The ratelimit plugin's configuration, for the filter and the bridge alike: the JSON a
//! gateway is given, parsed and validated all-or-nothing into the form the filter runs on;
//! the limits in the token bucket's exact units; and the bucket keys, made in one place so
//! that the bridge's `usage`, overrides and `check-config` name and judge exactly what the
//! gateways do. No state, no host, no I/O: the filter's runtime reads what is here (and
//! calls its pure functions, keys and paths, per request), and the bridge links it instead
//! of the whole filter.
//!
//! # Layout
//!
//! Bottom to top: each module uses only modules listed before it, tests aside
//! (`tools/layers.py` keeps them free of cycles).
//!
//! - `error`: the error every part of the configuration reports (field and problem).
//! - `json_path`: the path of the field a parse error is in, read from the text.
//! - `digest`: SHA-256, wherever hostile bytes must be shortened into a name.
//! - `keys`: identity values escaped into the keys' alphabet, the names keys are made of,
//!   and a rule's bucket key (`bucket_key`).
//! - `limit`: a rule's quota, in the exact integer units of the token bucket.
//! - `backend`: the `backend` section: the bridge (gRPC or HTTP) or Redis itself.
//! - `body_field`: a field of a JSON body, as a dotted path (a count, an ask, an identity).
//! - `source`: the `identity` section: where each value comes from, whether it is trusted.
//! - `path`: the one normal form rules match request paths in.
//! - `matcher`: a rule's `match` and the `method_override` headers.
//! - `scope`: Higress's `matchRules` (`_rules_`): what each entry matches.
//! - `block`: a rule's `block`, blocking repeat offenders.
//! - `lease`: a rule's `lease` of a hot bucket's tokens.
//! - `usage`: the usage formats by name: where each LLM API reports its tokens, by class.
//! - `meter`: a rule's `meter`: a cost read from the response, reserved, then settled.
//! - `global`: a rule's `global`: one budget across regions, leased from a home ledger.
//! - `in_flight`: a rule's `in_flight`: how many requests of a key may be in flight at once.
//! - `quota_api`: the top-level `quota_api`: where a client reads its own quota.
//! - `options`: the plugin-wide options: shadow mode, the failure mode, headers, the
//!   circuit breaker, the deny cache's size.
//! - `rule`: one rule, validated against the configuration's identities.
//! - `config`: the whole plugin configuration, parsed and validated all-or-nothing.
//! - `loading`: what a gateway accepts as its configuration, and the words it refuses one
//!   with (`ratelimit-bridge check-config` says the same).

pub mod backend;
pub mod block;
pub mod body_field;
pub mod config;
pub mod digest;
pub mod error;
pub mod global;
pub mod in_flight;
mod json_path;
pub mod keys;
pub mod lease;
pub mod limit;
pub mod loading;
pub mod matcher;
pub mod meter;
pub mod options;
pub mod path;
pub mod quota_api;
pub mod rule;
pub mod scope;
pub mod source;
pub mod usage;
