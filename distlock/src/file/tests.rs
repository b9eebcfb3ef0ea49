//! The file backend's unit tests: lock file names and records, and the
//! checks of the lock directory and of every directory on its way.

use super::record::{parse_record, RECORD_MAGIC};
use super::*;
use std::fs::OpenOptions;

const TTL: Duration = Duration::from_secs(30);

#[test]
fn plain_keys_keep_their_name_and_others_are_hashed() {
    assert_eq!(
        file_name("nightly-backup_1.0", "lock"),
        "k-nightly-backup_1.0.lock"
    );
    for odd in ["a/b", "../etc", ".hidden", "ключ", "a b", &"x".repeat(101)] {
        let name = file_name(odd, "lock");
        assert!(
            name.starts_with("h-") && name.len() == 2 + 32 + 5,
            "{odd:?} -> {name}"
        );
    }
    assert_ne!(file_name("a/b", "lock"), file_name("a/c", "lock"));
}

#[test]
fn records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap();
    assert_eq!(read_record(&file, &path).unwrap(), None);
    let record = Record {
        fencing_token: 7,
        pid: 42,
        owner: "abc".into(),
        holder: Some(HolderRecord::now(Duration::from_secs(30))),
        key: Some("jobs/nightly\nbackup".into()),
    };
    write_record(&file, &record).unwrap();
    assert_eq!(read_record(&file, &path).unwrap(), Some(record));
    // A shorter record after a longer one leaves no tail behind.
    let short = Record {
        fencing_token: 8,
        pid: 43,
        owner: "abd".into(),
        holder: None,
        key: None,
    };
    write_record(&file, &short).unwrap();
    assert_eq!(read_record(&file, &path).unwrap(), Some(short));
}

#[test]
fn a_record_of_a_distlock_before_holder_records_still_reads() {
    let text = format!("{RECORD_MAGIC} {:020} {:010} owner-token\n", 9, 77);
    let record = parse_record(&text).expect("the old one-line record");
    assert_eq!(
        (record.fencing_token, record.pid, record.holder, record.key),
        (9, 77, None, None)
    );
}

#[test]
fn a_foreign_file_is_an_error_not_a_reset_counter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k-x.lock");
    std::fs::write(&path, "hello").unwrap();
    let file = File::open(&path).unwrap();
    let err = read_record(&file, &path).unwrap_err().to_string();
    assert!(err.contains("does not hold a distlock record"), "{err}");
}

#[test]
fn the_default_directory_survives_reboots() {
    assert_eq!(
        default_dir_from(Some("/st".into()), Some("/home/u".into()), 7),
        PathBuf::from("/st/distlock/locks")
    );
    assert_eq!(
        default_dir_from(None, Some("/home/u".into()), 7),
        PathBuf::from("/home/u/.local/state/distlock/locks")
    );
    assert_eq!(
        default_dir_from(None, None, 7),
        PathBuf::from("/var/tmp/distlock-7/locks"),
        "not /tmp, which a reboot empties (and fencing counters with it)"
    );
}

#[test]
fn created_directories_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let locks = dir.path().join("a/b/locks");
    FileLocker::new(&locks).unwrap();
    for path in [dir.path().join("a"), dir.path().join("a/b"), locks] {
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
    }
}

#[test]
fn a_directory_every_user_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = FileLocker::new(&open).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { what: "lock directory", reason } if reason.contains("writable by every user")),
        "{err}"
    );
    // Inside a world-writable parent without the sticky bit, too.
    let inner = open.join("locks");
    std::fs::create_dir(&inner).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
    let err = FileLocker::new(&inner).unwrap_err();
    assert!(err.to_string().contains("writable by every user"), "{err}");
    // A sticky parent (as /tmp) is fine.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    FileLocker::new(&inner).unwrap();
}

/// Gives `path` (not following a symlink) to `uid`: a directory or link
/// of another local user. Needs root, as these tests do.
fn give_to(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))
        .expect("chown to another uid (these tests run as root)");
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Asserts that `dir` is refused as a lock directory for a reason that
/// says every one of `says`.
fn assert_refused(dir: impl AsRef<Path>, says: &[&str]) {
    match FileLocker::new(dir) {
        Err(Error::InvalidInput {
            what: "lock directory",
            reason,
        }) => {
            for part in says {
                assert!(reason.contains(part), "{reason}");
            }
        }
        other => panic!("not refused as a lock directory: {other:?}"),
    }
}

/// The path of the lock directory was resolved again at every open: a
/// symlink on the way swapped after the check sent the lock files to
/// another directory, where another process (in the original one) did
/// not see them.
#[tokio::test]
async fn an_ancestor_symlink_swapped_after_the_build_does_not_move_the_lock_files() {
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (root.path().join("first"), root.path().join("second"));
    for dir in [&first, &second] {
        std::fs::create_dir_all(dir.join("locks")).unwrap();
    }
    let link = root.path().join("current");
    std::os::unix::fs::symlink(&first, &link).unwrap();
    let locker = FileLocker::new(link.join("locks")).unwrap();
    // Swapped atomically: a new link renamed over the old one.
    let next = root.path().join("next");
    std::os::unix::fs::symlink(&second, &next).unwrap();
    std::fs::rename(&next, &link).unwrap();

    let mut lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
    assert!(first.join("locks/k-k.lock").is_file());
    assert!(!second.join("locks/k-k.lock").exists());
    let beside = FileLocker::new(first.join("locks")).unwrap();
    assert!(
        beside.try_lock("k", TTL).await.unwrap().is_none(),
        "the lock is in the directory that was checked"
    );
    lease.refresh(TTL).await.expect("still its file");
    #[cfg(target_os = "linux")]
    assert_eq!(
        locker.inspect("k").await.unwrap().map(|held| held.key),
        Some("k".to_owned())
    );
    locker.advance_mark("m", 1).await.unwrap();
    assert!(first.join("locks/k-m.mark").is_file());
    assert!(!second.join("locks/k-m.mark").exists());
    lease.release().await.unwrap();
    locker.forget("k").await.unwrap();
    assert!(!first.join("locks/k-k.lock").exists(), "forgotten there");
}

/// Only the lock directory and its parent were checked.
#[test]
fn a_directory_on_the_way_owned_by_another_user_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let theirs = root.path().join("theirs");
    let locks = theirs.join("mine/locks");
    std::fs::create_dir_all(&locks).unwrap();
    give_to(&theirs, 4242);
    let owner = format!("the directory {} belongs to uid 4242", theirs.display());
    assert_refused(&locks, &[&owner]);
    // The lock directory itself, too.
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    give_to(&other, 4242);
    assert_refused(&other, &["belongs to uid 4242"]);
}

/// Only writable-by-every-user was refused: a group's members could
/// replace the lock directory or its files just as well.
#[test]
fn a_directory_writable_by_its_group_is_refused_unless_sticky_on_the_way() {
    let root = tempfile::tempdir().unwrap();
    let group = root.path().join("group");
    std::fs::create_dir(&group).unwrap();
    set_mode(&group, 0o770);
    let writable = format!("{} is writable by its group (mode 770)", group.display());
    assert_refused(&group, &[&writable, "chmod go-w"]);
    let locks = group.join("locks");
    std::fs::create_dir(&locks).unwrap();
    set_mode(&locks, 0o700);
    assert_refused(
        &locks,
        &["writable by its group (mode 770) without the sticky bit"],
    );
    // Sticky on the way (as /tmp) is fine; for the lock directory it is not.
    set_mode(&group, 0o1770);
    FileLocker::new(&locks).unwrap();
    assert_refused(&group, &["writable by its group"]);
}

/// A symlink on the way in a shared sticky directory, owned by another
/// user, who can replace it at will: canonicalizing followed it.
#[test]
fn a_symlink_on_the_way_owned_by_another_user_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    let mine = root.path().join("mine");
    std::fs::create_dir(&shared).unwrap();
    std::fs::create_dir(&mine).unwrap();
    // Group-writable and sticky: accepted on the way, and the kernel's
    // protected_symlinks (world-writable sticky directories only) lets
    // it be followed.
    set_mode(&shared, 0o1770);
    let link = shared.join("link");
    std::os::unix::fs::symlink(&mine, &link).unwrap();
    give_to(&link, 4242);
    let owner = format!("the symbolic link {} belongs to uid 4242", link.display());
    assert_refused(link.join("locks"), &[&owner]);
    // Ours, it is followed.
    // SAFETY: geteuid has no preconditions and cannot fail.
    give_to(&link, unsafe { libc::geteuid() });
    let locker = FileLocker::new(link.join("locks")).unwrap();
    assert!(mine.join("locks").is_dir());
    assert_eq!(locker.dir(), link.join("locks"));
}

#[tokio::test]
async fn the_default_directory_under_var_tmp_works() {
    // SAFETY: getuid has no preconditions and cannot fail.
    let dir = default_dir_from(None, None, unsafe { libc::getuid() });
    assert!(dir.starts_with("/var/tmp"));
    let locker = FileLocker::new(&dir).unwrap();
    let key = format!("default-dir-test-{}", crate::new_owner_token());
    let lease = locker.try_lock(&key, TTL).await.unwrap().unwrap();
    assert!(locker.path_for(&key).is_file());
    lease.release().await.unwrap();
    locker.forget(&key).await.unwrap();
}

#[tokio::test]
async fn a_symlink_planted_as_a_lock_file_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let locker = FileLocker::new(dir.path().join("locks")).unwrap();
    let target = dir.path().join("victim");
    std::fs::write(&target, "precious\n").unwrap();
    std::os::unix::fs::symlink(&target, locker.path_for("k")).unwrap();
    let err = locker
        .try_lock("k", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Backend { .. }) && err.to_string().contains("symbolic link"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
}

#[tokio::test]
async fn a_duplicated_lock_fd_keeps_the_lock_held_after_the_release() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, other) = (
        FileLocker::new(dir.path()).unwrap(),
        FileLocker::new(dir.path()).unwrap(),
    );
    let lease = holder
        .try_lock("k", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let duplicate = lease.duplicate_lock_fd().expect("a file lock").unwrap();
    lease.release().await.unwrap();
    assert!(
        other
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "the open file is still held through the duplicate"
    );
    drop(duplicate);
    let next = other.try_lock("k", Duration::from_secs(5)).await.unwrap();
    assert!(
        next.is_some(),
        "closing the last descriptor frees the flock"
    );
}
