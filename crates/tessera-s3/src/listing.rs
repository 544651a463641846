//! ListObjects (v1 and v2) over a sorted list of keys: prefix, delimiter, the marker to start
//! after, and the page size. Pure: the caller lists the bucket's files and passes their keys.

/// The most entries one page holds (S3's limit, and its default).
pub const PAGE_ENTRIES_MAX: usize = 1000;

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    /// Keys listed, with the index of each in the input.
    pub objects: Vec<usize>,
    /// Common prefixes (up to and including the delimiter), sorted.
    pub common_prefixes: Vec<String>,
    /// More entries follow this page.
    pub truncated: bool,
    /// The last entry of this page (key or common prefix), to start the next page after;
    /// set when truncated.
    pub next_marker: Option<String>,
}

/// The page of `keys` (sorted, each starting with `prefix`) that follows `after`, holding at
/// most `max_entries` objects and common prefixes together.
pub fn page(
    keys: &[&str],
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<&str>,
    max_entries: usize,
) -> Page {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let mut out = Page::default();
    let mut entries = 0usize;
    let mut last: Option<String> = None;
    for (index, key) in keys.iter().enumerate() {
        assert!(key.starts_with(prefix), "key {key} outside prefix {prefix}");
        let common = delimiter.and_then(|d| {
            let rest = &key[prefix.len()..];
            rest.find(d)
                .map(|at| key[..prefix.len() + at + d.len()].to_string())
        });
        // A page that ended at a common prefix went past every key under it.
        let entry = common.as_deref().unwrap_or(key);
        if after.is_some_and(|after| entry <= after) {
            continue;
        }
        if common.is_some() && out.common_prefixes.last() == common.as_ref() {
            continue;
        }
        if entries == max_entries {
            out.truncated = true;
            out.next_marker = last;
            return out;
        }
        entries += 1;
        last = Some(entry.to_string());
        match common {
            Some(common) => out.common_prefixes.push(common),
            None => out.objects.push(index),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 7] = ["a", "b/1", "b/2", "b/3/x", "c", "d/1", "e"];

    fn walk(prefix: &str, delimiter: Option<&str>, max: usize) -> (Vec<String>, usize) {
        let keys: Vec<&str> = KEYS
            .iter()
            .copied()
            .filter(|k| k.starts_with(prefix))
            .collect();
        let (mut seen, mut pages, mut after) = (Vec::new(), 0, None::<String>);
        loop {
            let p = page(&keys, prefix, delimiter, after.as_deref(), max);
            pages += 1;
            seen.extend(p.objects.iter().map(|&i| keys[i].to_string()));
            seen.extend(p.common_prefixes.iter().cloned());
            if !p.truncated {
                return (seen, pages);
            }
            after = p.next_marker;
            assert!(pages < 100);
        }
    }

    #[test]
    fn delimiter_groups_and_pages_never_repeat() {
        let (mut all, _) = walk("", Some("/"), 1000);
        all.sort();
        assert_eq!(all, ["a", "b/", "c", "d/", "e"]);
        for max in 1..=5 {
            let (mut paged, pages) = walk("", Some("/"), max);
            paged.sort();
            assert_eq!(paged, all, "page size {max}");
            assert_eq!(pages, 5usize.div_ceil(max), "page size {max}");
        }
    }

    #[test]
    fn prefix_without_delimiter_lists_every_key() {
        let (seen, pages) = walk("b/", None, 2);
        assert_eq!(seen, ["b/1", "b/2", "b/3/x"]);
        assert_eq!(pages, 2);
        let (seen, _) = walk("b/", Some("/"), 1000);
        assert_eq!(seen, ["b/1", "b/2", "b/3/"]);
    }

    #[test]
    fn zero_entries_and_a_marker_past_the_end() {
        let p = page(&KEYS, "", None, None, 0);
        assert!(p.truncated && p.objects.is_empty() && p.next_marker.is_none());
        assert_eq!(page(&KEYS, "", None, Some("z"), 10), Page::default());
        let p = page(&KEYS, "", Some("/"), Some("b/"), 1);
        assert_eq!(p.objects, [4]);
    }
}
