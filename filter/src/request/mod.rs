//! What a request asks for: who is calling, which rules apply, and the bucket each of them
//! checks (`rules::plan`: one `PlannedRule` per bucket, or why the request is refused
//! before any check).
//!
//! A layer of its own because everything here reads hostile request data and nothing here
//! decides: headers, a JWT, the peer's address and the route become bounded, key-safe
//! values and a plan, through `host::RequestView` alone. What becomes of the plan (the deny
//! cache, leases, the bridge, the failure mode) is `decision`'s.
//!
//! Bottom to top: `jwt` (one claim out of a JWT payload), `matcher` (whether a rule's
//! `match` covers the request), `scope` (which of Higress's `matchRules` entries it falls
//! in), `identity` (who is calling), `rules` (which rules apply, and their keys).

pub mod identity;
pub mod jwt;
pub mod matcher;
pub mod rules;
pub mod scope;
