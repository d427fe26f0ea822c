//! The messages of `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, declared
//! with prost's derive from Envoy's `rls.proto` and `ratelimit.proto` (api/envoy/service/
//! ratelimit/v3, api/envoy/extensions/common/ratelimit/v3): only the fields the bridge reads
//! or writes. Unknown fields are skipped on decoding, as protobuf wants, so a newer Envoy's
//! additions are harmless. The tags are the contract with Envoy; `tests` pins them to bytes
//! written by hand from the `.proto` files.

/// The full method path Envoy's `ratelimit` filter calls.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Hits every descriptor adds (0: not set, which means 1).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit the caller sets for this descriptor, instead of the configured one.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<LimitOverride>,
    /// `google.protobuf.UInt64Value`: this descriptor's own hits, 0 included.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`, numbered as `Unit`.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// `Code`.
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// What Envoy's `ratelimit` filter puts in the request's dynamic metadata, under its
    /// own name (`envoy.filters.http.ratelimit`), where a `metadata` action of a later
    /// descriptor (a commit's, at the stream's end) reads it.
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`: one of its kinds. Envoy's `metadata` action reads strings
/// only; envoyproxy/ratelimit's dynamic metadata (`dynamic`) holds any.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`, written as a oneof member is, even when empty.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `NULL_VALUE` (0).
    #[prost(int32, tag = "1")]
    Null(i32),
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    String(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "5")]
    Struct(Struct),
    #[prost(message, tag = "6")]
    List(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    pub fn of(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }

    pub fn string(text: String) -> Value {
        Value::of(Kind::String(text))
    }

    /// Its text, if it is text.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(Kind::String(text)) => Some(text),
            _ => None,
        }
    }
}

impl Struct {
    /// A struct of one string field.
    pub fn one(name: &str, value: String) -> Struct {
        Struct {
            fields: [(name.to_owned(), Value::string(value))].into(),
        }
    }
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// `Code`.
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `Unit`.
    #[prost(int32, tag = "2")]
    pub unit: i32,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitResponse.Code`.
pub const CODE_OK: i32 = 1;
pub const CODE_OVER_LIMIT: i32 = 2;

impl Duration {
    pub fn from_ms(ms: u64) -> Duration {
        Duration {
            seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
            nanos: ((ms % 1000) * 1_000_000) as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_request_as_envoy_writes_it_is_read() {
        // domain "d" (1), a descriptor (2) holding an entry (1) {key "k" (1), value "v"
        // (2)}, an override (2) {10 (1), MINUTE = 2 (2)} and hits_addend (3) {0 (1)},
        // then hits_addend 5 (3).
        let bytes = [
            0x0a, 1, b'd', //
            0x12, 18, //
            0x0a, 6, 0x0a, 1, b'k', 0x12, 1, b'v', //
            0x12, 4, 0x08, 10, 0x10, 2, //
            0x1a, 2, 0x08, 0, //
            0x18, 5,
        ];
        let read = RateLimitRequest::decode(&bytes[..]).unwrap();
        assert_eq!(read.domain, "d");
        assert_eq!(read.hits_addend, 5);
        let descriptor = &read.descriptors[0];
        assert_eq!(
            (&*descriptor.entries[0].key, &*descriptor.entries[0].value),
            ("k", "v")
        );
        let limit = descriptor.limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (10, 2));
        assert_eq!(descriptor.hits_addend.as_ref().map(|h| h.value), Some(0));
    }

    #[test]
    fn a_response_is_written_with_envoys_tags() {
        let response = RateLimitResponse {
            overall_code: CODE_OVER_LIMIT,
            statuses: vec![DescriptorStatus {
                code: CODE_OVER_LIMIT,
                current_limit: Some(RateLimit {
                    requests_per_unit: 3,
                    unit: 1,
                    name: "n".into(),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration::from_ms(1500)),
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "a".into(),
                value: "b".into(),
            }],
            dynamic_metadata: Some(Struct::one("r", "7".into())),
        };
        let expected = [
            0x08, 2, // overall_code
            0x12, 21, // statuses
            0x08, 2, // code
            0x12, 7, 0x08, 3, 0x10, 1, 0x1a, 1, b'n', // current_limit
            // limit_remaining 0 is not written
            0x22, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01, // 1 s 500,000,000 ns
            0x1a, 6, 0x0a, 1, b'a', 0x12, 1, b'b', // response_headers_to_add
            // dynamic_metadata: fields (1) {key "r" (1), value (2) {string_value "7" (3)}}
            0x32, 10, 0x0a, 8, 0x0a, 1, b'r', 0x12, 3, 0x1a, 1, b'7',
        ];
        assert_eq!(response.encode_to_vec(), expected);
    }
}
