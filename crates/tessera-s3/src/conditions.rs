//! Conditional requests as S3 applies RFC 7232: `If-Match`, `If-None-Match`,
//! `If-Modified-Since` and `If-Unmodified-Since` on GET and HEAD (and their
//! `x-amz-copy-source-if-*` forms on CopyObject, where every failure is a 412), and
//! `If-Match`/`If-None-Match` on PutObject.
//!
//! As in S3, `If-Match` that holds overrides a failing `If-Unmodified-Since`, and
//! `If-None-Match` that holds overrides a failing `If-Modified-Since`. Times compare in whole
//! seconds (HTTP dates have no finer resolution).

use s3s::dto::{ETagCondition, Timestamp, TimestampFormat};

/// The conditions of one request.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Conditions<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<&'a Timestamp>,
    pub if_unmodified_since: Option<&'a Timestamp>,
}

/// What the conditions say about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve the request.
    Proceed,
    /// `304 Not Modified` (a copy: `412`).
    NotModified,
    /// `412 Precondition Failed`.
    Failed,
}

/// Whether `condition` matches an object whose ETag is `etag` (unquoted).
pub(crate) fn etag_matches(condition: &ETagCondition, etag: &str) -> bool {
    match condition {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value().trim_matches('"') == etag,
    }
}

/// Seconds since the epoch of a timestamp.
fn seconds(t: &Timestamp) -> Option<i64> {
    let mut text = Vec::new();
    t.format(TimestampFormat::EpochSeconds, &mut text).ok()?;
    let text = String::from_utf8(text).ok()?;
    text.split('.').next()?.parse().ok()
}

/// The verdict for an object with `etag`, last modified at `modified_ms` (if known).
pub(crate) fn evaluate(c: Conditions<'_>, etag: &str, modified_ms: Option<u64>) -> Verdict {
    let modified = modified_ms.map(|ms| (ms / 1000) as i64);
    let later_than = |t: &Timestamp| modified.zip(seconds(t)).map(|(m, t)| m > t);
    if let Some(condition) = c.if_match {
        if !etag_matches(condition, etag) {
            return Verdict::Failed;
        }
    } else if let Some(t) = c.if_unmodified_since {
        if later_than(t) == Some(true) {
            return Verdict::Failed;
        }
    }
    if let Some(condition) = c.if_none_match {
        if etag_matches(condition, etag) {
            return Verdict::NotModified;
        }
    } else if let Some(t) = c.if_modified_since {
        if later_than(t) == Some(false) {
            return Verdict::NotModified;
        }
    }
    Verdict::Proceed
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::dto::ETag;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> Timestamp {
        Timestamp::from(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn rfc7232_as_s3_applies_it() {
        let tag = ETagCondition::ETag(ETag::Strong("abc".into()));
        let other = ETagCondition::ETag(ETag::Strong("xyz".into()));
        let (before, after) = (at(999), at(1001));
        let ms = Some(1_000_500);
        let verdict = |c: Conditions<'_>| evaluate(c, "abc", ms);
        assert_eq!(verdict(Conditions::default()), Verdict::Proceed);
        let c = |m, n, ms_, us| Conditions {
            if_match: m,
            if_none_match: n,
            if_modified_since: ms_,
            if_unmodified_since: us,
        };
        assert_eq!(verdict(c(Some(&tag), None, None, None)), Verdict::Proceed);
        assert_eq!(verdict(c(Some(&other), None, None, None)), Verdict::Failed);
        assert_eq!(
            verdict(c(Some(&ETagCondition::Any), None, None, None)),
            Verdict::Proceed
        );
        assert_eq!(
            verdict(c(None, Some(&tag), None, None)),
            Verdict::NotModified
        );
        assert_eq!(verdict(c(None, Some(&other), None, None)), Verdict::Proceed);
        assert_eq!(
            verdict(c(None, None, Some(&after), None)),
            Verdict::NotModified
        );
        assert_eq!(
            verdict(c(None, None, Some(&before), None)),
            Verdict::Proceed
        );
        assert_eq!(verdict(c(None, None, None, Some(&before))), Verdict::Failed);
        assert_eq!(verdict(c(None, None, None, Some(&after))), Verdict::Proceed);
        // The ETag conditions win over the time ones.
        assert_eq!(
            verdict(c(Some(&tag), None, None, Some(&before))),
            Verdict::Proceed
        );
        assert_eq!(
            verdict(c(None, Some(&other), Some(&after), None)),
            Verdict::Proceed
        );
        // Unknown times never fail a condition.
        assert_eq!(
            evaluate(c(None, None, Some(&after), Some(&before)), "abc", None),
            Verdict::Proceed
        );
    }
}
