//! The flags that place a bridge in a region and name every region's Redis: `--region
//! NAME` and `--region-redis NAME=URL`, once per region, this bridge's own included. A URL
//! is one `--redis` takes, reached with the same TLS and credential flags; a region whose
//! Redis is a Cluster or a Sentinel group says so first: `NAME=cluster:URL,URL`,
//! `NAME=sentinel:MASTER@URL,URL`.

use super::Regions;
use crate::store::connection::redis_args::RedisArgs;
use crate::store::StoreOptions;
use clap::Args;
use ratelimit_protocol::global::valid_region;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct RegionArgs {
    /// This bridge's region: global rules' budgets are kept by ledgers in their home
    /// regions' Redis, and this bridge spends them through leases (docs/regions.md).
    /// Needs --region-redis for every region, this one included.
    #[arg(long, env = "RATELIMIT_BRIDGE_REGION", value_name = "NAME")]
    pub region: Option<String>,
    /// A region's Redis: NAME=URL (a URL as --redis takes it), NAME=cluster:URL,URL or
    /// NAME=sentinel:MASTER@URL,URL; once per region.
    #[arg(long = "region-redis", value_name = "NAME=URL")]
    pub region_redis: Vec<String>,
    /// The share of a lease's life this bridge gives up so that clocks running at
    /// different rates never let it spend a lease its ledger has taken back, in millionths:
    /// enough while this bridge's clock runs at least `1 - drift` times as fast as a home
    /// Redis's (10000: 1 %, for two clocks each within 0.5 % of true time).
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REGION_DRIFT_PPM",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(0..500_000)
    )]
    pub region_drift_ppm: u64,
    /// How long a check its leases cannot pay waits for a grant (a cold key's first, or
    /// one its spending outran while the ledger had tokens), in milliseconds: a
    /// cross-region round trip, outside the key's home.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REGION_WAIT_MS",
        default_value_t = 500,
        value_parser = clap::value_parser!(u64).range(1..=60_000)
    )]
    pub region_wait_ms: u64,
}

/// `NAME=...` read: the name, and `base` aimed at that region's Redis.
fn region_redis(value: &str, base: &RedisArgs) -> Result<(String, RedisArgs), String> {
    let Some((name, target)) = value.split_once('=') else {
        return Err(format!("--region-redis {value:?}: NAME=URL"));
    };
    if !valid_region(name) {
        return Err(format!(
            "--region-redis {name:?}: a region's name is 1 to 32 lower-case letters, digits and -"
        ));
    }
    let mut args = RedisArgs {
        redis: target.to_string(),
        cluster: false,
        sentinel: None,
        ..base.clone()
    };
    if let Some(seeds) = target.strip_prefix("cluster:") {
        args.redis = seeds.to_string();
        args.cluster = true;
    } else if let Some(rest) = target.strip_prefix("sentinel:") {
        let Some((master, sentinels)) = rest.split_once('@') else {
            return Err(format!("--region-redis {name}: sentinel:MASTER@URL,URL"));
        };
        args.redis = sentinels.to_string();
        args.sentinel = Some(master.to_string());
    }
    Ok((name.to_string(), args))
}

impl RegionArgs {
    /// The regions these flags name; `None` without `--region` (a global rule is then a
    /// plain one, this region's).
    pub fn regions(
        &self,
        base: &RedisArgs,
        options: StoreOptions,
    ) -> Result<Option<Regions>, String> {
        let Some(own) = &self.region else {
            if !self.region_redis.is_empty() {
                return Err("--region-redis needs --region".into());
            }
            return Ok(None);
        };
        if !valid_region(own) {
            return Err(format!(
                "--region {own:?}: a region's name is 1 to 32 lower-case letters, digits and -"
            ));
        }
        let mut stores = Vec::with_capacity(self.region_redis.len());
        for value in &self.region_redis {
            let (name, args) = region_redis(value, base)?;
            let store = args
                .store(options)
                .map_err(|e| format!("--region-redis {name}: {e}"))?;
            stores.push((name, store));
        }
        let wait = Duration::from_millis(self.region_wait_ms);
        Regions::new(own, stores, self.region_drift_ppm, wait).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        redis: RedisArgs,
    }

    #[test]
    fn a_regions_redis_is_a_url_a_cluster_or_a_sentinel_group() {
        let base = Cli::parse_from(["x", "--redis-username", "rl"]).redis;
        let (name, args) = region_redis("eu=redis://10.0.0.1:6379", &base).unwrap();
        assert_eq!(
            (name.as_str(), args.redis.as_str(), args.cluster),
            ("eu", "redis://10.0.0.1:6379", false)
        );
        assert_eq!(
            args.redis_username.as_deref(),
            Some("rl"),
            "the same credentials"
        );
        let (_, args) = region_redis("us=cluster:redis://a:1,redis://b:2", &base).unwrap();
        assert_eq!(
            (args.redis.as_str(), args.cluster),
            ("redis://a:1,redis://b:2", true)
        );
        let (_, args) = region_redis("ap=sentinel:main@redis://s:26379", &base).unwrap();
        assert_eq!(
            (args.redis.as_str(), args.sentinel.as_deref()),
            ("redis://s:26379", Some("main"))
        );
        for bad in ["eu", "EU=redis://a", "=redis://a", "ap=sentinel:redis://s"] {
            assert!(region_redis(bad, &base).is_err(), "{bad}");
        }
    }
}
