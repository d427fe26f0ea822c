//! The messages of the rate limit service's xDS subscription, declared with prost's derive:
//! `envoy.service.discovery.v3.DiscoveryRequest`/`DiscoveryResponse` (and the `Node`,
//! `google.protobuf.Any` and `google.rpc.Status` in them) on
//! `AggregatedDiscoveryService/StreamAggregatedResources`, and the resource,
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` (envoyproxy/ratelimit's
//! `api/ratelimit/config/ratelimit/v3/rls_conf.proto`). Only the fields the bridge reads or
//! writes; unknown fields are skipped on decoding. `tests` pins the tags to bytes written by
//! hand from the `.proto` files.

/// The method Envoy Gateway's rate limit configuration server serves.
pub const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// The resource type the bridge subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `DiscoveryRequest`: the subscription, and each ACK or NACK.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryRequest {
    /// The version last accepted (empty before any).
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// The nonce of the response this answers (empty for the first request).
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    /// Set on a NACK: why the response was refused.
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

/// `envoy.config.core.v3.Node`: who subscribes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "6")]
    pub user_agent_name: String,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `DiscoveryResponse`: every resource of the type, as of `version_info`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<Any>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `RateLimitConfig`: one domain's descriptors.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `RateLimitDescriptor`: the YAML's descriptor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    pub key: String,
    /// Empty: any value (the YAML's descriptor without `value`).
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<crate::doors::rls::proto::Struct>,
}

/// `RateLimitPolicy`: the YAML's `rate_limit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit`: UNKNOWN 0, SECOND 1, MINUTE 2, HOUR 3, DAY 4, MONTH 5, YEAR 6,
    /// WEEK 7, as Envoy's `RateLimitResponse.RateLimit.Unit` numbers them.
    #[prost(int32, tag = "1")]
    pub unit: i32,
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `RateLimitReplace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Tags and wire types as the `.proto` files number them, written out by hand.
    #[test]
    fn the_tags_are_the_protos() {
        let request = DiscoveryRequest {
            version_info: "v".into(),
            node: Some(Node {
                id: "n".into(),
                user_agent_name: "u".into(),
            }),
            type_url: "t".into(),
            response_nonce: "c".into(),
            error_detail: Some(Status {
                code: 3,
                message: "m".into(),
            }),
        };
        let expected = [
            0x0a, 1, b'v', // version_info = 1
            0x12, 6, 0x0a, 1, b'n', 0x32, 1, b'u', // node = 2 { id = 1, user_agent_name = 6 }
            0x22, 1, b't', // type_url = 4
            0x2a, 1, b'c', // response_nonce = 5
            0x32, 5, 0x08, 3, 0x12, 1, b'm', // error_detail = 6 { code = 1, message = 2 }
        ];
        assert_eq!(request.encode_to_vec(), expected);
        let config = [
            0x0a, 1, b'n', // name = 1
            0x12, 1, b'd', // domain = 2
            0x1a, 26, // descriptors = 3
            0x0a, 1, b'k', // key = 1
            0x12, 1, b'v', // value = 2
            0x1a, 14, // rate_limit = 3
            0x08, 2, // unit = 1: MINUTE
            0x10, 5, // requests_per_unit = 2
            0x18, 1, // unlimited = 3
            0x22, 1, b'r', // name = 4
            0x2a, 3, 0x0a, 1, b'o', // replaces = 5 { name = 1 }
            0x22, 0, // descriptors = 4 (one, empty)
            0x28, 1, // shadow_mode = 5
        ];
        let decoded = RateLimitConfig::decode(&config[..]).unwrap();
        let descriptor = &decoded.descriptors[0];
        let policy = descriptor.rate_limit.as_ref().unwrap();
        assert_eq!((decoded.name.as_str(), decoded.domain.as_str()), ("n", "d"));
        assert_eq!(
            (descriptor.key.as_str(), descriptor.value.as_str()),
            ("k", "v")
        );
        assert_eq!(
            (policy.unit, policy.requests_per_unit, policy.unlimited),
            (2, 5, true)
        );
        assert_eq!(
            (policy.name.as_str(), policy.replaces[0].name.as_str()),
            ("r", "o")
        );
        assert_eq!(descriptor.descriptors.len(), 1);
        assert!(descriptor.shadow_mode);
        let response = [
            0x0a, 1, b'1', // version_info = 1
            0x12, 5, 0x0a, 1, b't', 0x12, 0, // resources = 2 { type_url = 1, value = 2 }
            0x22, 1, b't', // type_url = 4
            0x2a, 1, b'x', // nonce = 5
        ];
        let decoded = DiscoveryResponse::decode(&response[..]).unwrap();
        assert_eq!(decoded.version_info, "1");
        assert_eq!(decoded.resources[0].type_url, "t");
        assert_eq!(
            (decoded.type_url.as_str(), decoded.nonce.as_str()),
            ("t", "x")
        );
    }
}
