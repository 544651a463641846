//! Inode numbers for paths: the kernel names files by number, the manager by path.
//!
//! A number is handed out the first time the kernel looks a path up and kept while the
//! mount runs (numbers are never reused, so a stale one finds nothing rather than another
//! file). A rename re-points every number below the renamed path, so that open files and
//! the kernel's cached entries follow it.

use std::collections::HashMap;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// Paths by inode number and back.
#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, String>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut inodes = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
        };
        inodes.by_ino.insert(ROOT, String::new());
        inodes.by_path.insert(String::new(), ROOT);
        inodes
    }
}

impl Inodes {
    /// The path of `ino`, if it was handed out and not forgotten.
    pub fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(String::as_str)
    }

    /// The number of `path`, handed out now if it has none.
    pub fn ino(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, path.to_string());
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// Forgets `path` (removed): its number finds nothing from now on.
    pub fn remove(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            self.by_ino.remove(&ino);
        }
    }

    /// Moves `from` and everything below it to `to`; whatever `to` named before is forgotten.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        self.remove_below(to);
        self.remove(to);
        let below = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| path.as_str() == from || path.starts_with(&below))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (path, ino) in moved {
            let renamed = format!("{to}{}", &path[from.len()..]);
            self.by_path.remove(&path);
            self.by_path.insert(renamed.clone(), ino);
            self.by_ino.insert(ino, renamed);
        }
    }

    fn remove_below(&mut self, path: &str) {
        let below = format!("{path}/");
        let gone: Vec<String> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(&below))
            .cloned()
            .collect();
        for path in gone {
            self.remove(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_rename_moves_the_subtree_and_only_it() {
        let mut inodes = Inodes::default();
        let dir = inodes.ino("d");
        let file = inodes.ino("d/f");
        let deep = inodes.ino("d/e/g");
        let neighbour = inodes.ino("d-x");
        let replaced = inodes.ino("n");
        inodes.rename("d", "n");
        assert_eq!(inodes.path(dir), Some("n"));
        assert_eq!(inodes.path(file), Some("n/f"));
        assert_eq!(inodes.path(deep), Some("n/e/g"));
        assert_eq!(inodes.path(neighbour), Some("d-x"));
        assert_eq!(inodes.path(replaced), None);
        assert_eq!(inodes.ino("n/f"), file);
        assert_ne!(inodes.ino("d/f"), file, "the old path gets a new number");
    }

    proptest! {
        /// Numbers and paths stay a bijection whatever is looked up, removed and renamed.
        #[test]
        fn numbers_and_paths_stay_one_to_one(
            ops in proptest::collection::vec((0u8..3, "[ab]{1,2}(/[ab]{1,2}){0,2}", "[ab]{1,2}(/[ab]){0,1}"), 1..60)
        ) {
            let mut inodes = Inodes::default();
            for (op, a, b) in ops {
                match op {
                    0 => { inodes.ino(&a); }
                    1 => inodes.remove(&a),
                    _ => if !b.starts_with(&format!("{a}/")) { inodes.rename(&a, &b) },
                }
                prop_assert_eq!(inodes.by_ino.len(), inodes.by_path.len());
                for (ino, path) in &inodes.by_ino {
                    prop_assert_eq!(inodes.by_path.get(path), Some(ino));
                }
                prop_assert_eq!(inodes.path(ROOT), Some(""));
            }
        }
    }
}
