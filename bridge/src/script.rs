//! The token bucket script as the bridge calls it: the calling convention shared with the
//! filter's redis-call build (`ratelimit_protocol::script`), which lays a call's keys and
//! arguments out and reads its reply back.

pub use ratelimit_protocol::script::{
    decode, integers, layout, part_rules, shape, Layout, Mode, Part, ScriptOutcome, Shape,
    FOREIGN_VALUE, MAX_KEYS_PER_CALL, MAX_PARTS_PER_CALL, MAX_PART_RULES, MAX_SHAPES,
    TOKEN_BUCKET_LUA,
};
