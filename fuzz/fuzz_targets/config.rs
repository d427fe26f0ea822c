//! Holds `Config::parse` to refusing any bad input without panicking, and every
//! configuration it accepts to planning, for any request, a check the bridge accepts as is
//! (its keys in the keys' grammar, which the bridge holds every check to).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_config::config::Config;
use ratelimit_filter::decision::slots::{name_slots, Ids};
use ratelimit_filter::host::RequestView;
use ratelimit_filter::metering::Text;
use ratelimit_filter::request::identity::{self, BodyRead};
use ratelimit_filter::request::rules::{plan, Unplanned};
use ratelimit_filter::wire::encode_check;
use ratelimit_fuzz::Request;
use ratelimit_protocol::{key, parse_batch, Line, LineKind, RuleSpec};

fuzz_target!(|data: &[u8]| {
    // The configuration, then after a NUL (which JSON never holds) the request.
    let mut parts = data.splitn(2, |&b| b == 0);
    let json = parts.next().unwrap_or_default();
    let Ok(config) = Config::parse(json) else {
        return;
    };
    // An identity that cannot be told (repeated, unreadable), or one missing that a rule
    // will not do without, refuses the request: nothing to plan. A shadow rule reported as
    // refusing for a missing identity is one the request applies to.
    let request = Request::from_lines(parts.next().unwrap_or_default());
    let mut shadowed = Vec::new();
    let mut planned = plan(&config, &request, None, |rule| shadowed.push(rule));
    if planned == Err(Unplanned::AwaitsBody) {
        // A rule keyed on a body field: planned again with what the body held there (a
        // string, any bytes: each identity's value from a header of its own name).
        let values: Vec<_> = (config.identities.iter())
            .map(|identity| {
                let held = request.header(&format!("body.{}", identity.name));
                identity::body_value(held.map_or(Text::Absent, Text::Str), BodyRead::Json)
            })
            .collect();
        shadowed.clear();
        planned = plan(&config, &request, Some(&values), |rule| shadowed.push(rule));
    }
    let Ok(mut planned) = planned else {
        return;
    };
    // Its in-flight rules' slots named, as a worker names them before the check leaves.
    name_slots(&mut planned, &mut Ids::default());
    assert!(shadowed.iter().all(|&r| config.rules[r].shadow));
    assert!(planned.windows(2).all(|w| w[0].rule < w[1].rule));
    for p in &planned {
        assert!(key::parse_key(&p.key).is_ok(), "{}", p.key);
    }
    if planned.is_empty() {
        return;
    }
    let mut line = String::new();
    encode_check(&mut line, planned.iter().map(|p| p.spec_ref(&config)));
    let sent: Vec<RuleSpec> = planned
        .iter()
        .map(|p| RuleSpec {
            key: p.key.clone(),
            burst: p.limit.burst,
            num: p.limit.num,
            den: p.limit.den,
            cost: p.cost,
            lease: p.lease,
            block: p.block,
            shadow: p.shadow,
            overridden: None,
            settle: None,
            global: config.rules[p.rule].global.clone(),
            slot: p.slot.clone(),
            calendar: (config.rules[p.rule].calendar(&p.limit)).map(|(period, zone)| {
                ratelimit_protocol::calendar::Calendar {
                    period,
                    zone: zone.to_string(),
                }
            }),
            bounds: None,
            plan: None,
        })
        .collect();
    let sent = Line {
        kind: LineKind::Check,
        rules: sent,
    };
    assert_eq!(parse_batch(line.as_bytes()), Ok(vec![Ok(sent)]), "{line}");
});
