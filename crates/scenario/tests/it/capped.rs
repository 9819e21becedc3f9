//! The capped reader: the bound is on the bytes read, not on what the metadata says.

use baton_scenario::capped::{self, Error};

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-capped-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_file_at_its_cap_is_read_and_one_byte_more_is_refused() {
    let dir = scratch("cap");
    let file = dir.join("f");
    std::fs::write(&file, vec![b'a'; 100]).unwrap();
    assert_eq!(capped::read_bytes(&file, 100).unwrap().len(), 100);
    let err = capped::read_bytes(&file, 99).unwrap_err();
    assert!(matches!(err, Error::TooLarge { bytes_max: 99, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("{} is larger than 99 bytes; make it smaller", file.display())
    );
}

#[test]
fn a_file_whose_metadata_reports_no_size_is_still_bounded() {
    // /proc files report a length of 0 and hold more: only the bytes read bound them.
    let maps = std::path::Path::new("/proc/self/maps");
    assert_eq!(std::fs::metadata(maps).unwrap().len(), 0);
    let err = capped::read_bytes(maps, 16).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

#[test]
fn what_is_not_a_regular_file_is_named_and_refused() {
    let dir = scratch("kinds");
    let link = dir.join("zero");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let err = capped::read_text(&link, 1024).unwrap_err();
    assert!(matches!(err, Error::NotRegular { kind: "character device", .. }), "{err}");
    let err = capped::read_text(&dir, 1024).unwrap_err();
    assert!(matches!(err, Error::NotRegular { kind: "directory", .. }), "{err}");
    let err = capped::read_text(&dir.join("missing"), 1024).unwrap_err();
    assert!(matches!(err, Error::Missing { .. }), "{err}");
    std::fs::write(dir.join("latin1"), b"caf\xe9").unwrap();
    let err = capped::read_text(&dir.join("latin1"), 1024).unwrap_err();
    assert!(matches!(err, Error::NotUtf8 { offset: 3, .. }), "{err}");
}

#[test]
fn sizes_read_as_limits() {
    assert_eq!(capped::size(1024 * 1024), "1 MiB");
    assert_eq!(capped::size(256 * 1024), "256 KiB");
    assert_eq!(capped::size(1000), "1000 bytes");
}
