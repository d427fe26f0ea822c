//! A `RateLimitConfig` resource as the YAML it stands for: the same tree, read by the same
//! builder (`Limits::build`), so a limit means the same from a file or from xDS and is
//! refused with the same line. What the YAML cannot say is refused here: `quota_mode`.

use super::proto::{RateLimitConfig, RateLimitDescriptor};
use crate::doors::rls::raw::{unit_name, RawDescriptor, RawDomain, RawRateLimit, RawReplaces};

/// The domain `config` configures.
pub(crate) fn domain(config: RateLimitConfig) -> Result<RawDomain, String> {
    Ok(RawDomain {
        domain: config.domain,
        descriptors: descriptors(config.descriptors, "")?,
    })
}

fn descriptors(list: Vec<RateLimitDescriptor>, parent: &str) -> Result<Vec<RawDescriptor>, String> {
    list.into_iter()
        .map(|d| {
            let path = match parent {
                "" => d.key.clone(),
                _ => format!("{parent}.{}", d.key),
            };
            if d.quota_mode {
                return Err(format!("{path}: quota_mode is not supported"));
            }
            let rate_limit = d.rate_limit.map(|policy| RawRateLimit {
                // UNKNOWN (0) is no unit, which a limit that is not unlimited refuses; an
                // unlimited one's unit means nothing (a message always carries one).
                unit: unit_name(policy.unit)
                    .filter(|_| !policy.unlimited)
                    .map(str::to_owned),
                requests_per_unit: (!policy.unlimited).then_some(policy.requests_per_unit),
                unlimited: policy.unlimited,
                name: Some(policy.name).filter(|n| !n.is_empty()),
                replaces: policy
                    .replaces
                    .into_iter()
                    .map(|r| RawReplaces { name: r.name })
                    .collect(),
                // The xDS resource has no place for them: a file's extensions.
                global: None,
                in_flight: None,
            });
            Ok(RawDescriptor {
                descriptors: descriptors(d.descriptors, &path)?,
                key: d.key,
                value: Some(d.value).filter(|v| !v.is_empty()),
                rate_limit,
                shadow_mode: d.shadow_mode,
                share_threshold: false,
                _detailed_metric: d.detailed_metric,
                _value_to_metric: false,
                metadata: d.metadata,
            })
        })
        .collect()
}
