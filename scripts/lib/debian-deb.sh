# Sourced by the install scripts: fetch one Debian package's .deb through a private apt
# configuration (its own sources list, lists and cache in a temporary directory, pointed
# at the mirror this machine already uses) and unpack it with dpkg-deb. The system's apt
# state is not touched, and nothing is installed system-wide.
#
#   debian_deb PACKAGE VERSION_PREFIX SUITE DEST
#
# Takes the newest build of PACKAGE whose Debian version starts with VERSION_PREFIX- in
# SUITE, unpacks it into DEST (replacing DEST), and prints the Debian version it took.
# Needs `say` and `die` from the caller.

debian_deb() {
  local package=$1 version=$2 suite=$3 dest=$4
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    die "apt-get and dpkg-deb are needed to fetch $package from Debian"
  local mirror=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources | grep -v -- '-security' | head -1)
  fi
  if [ -z "$mirror" ] && [ -r /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
  fi
  [ -n "$mirror" ] ||
    die "found no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -r "$keyring" ] || die "$keyring is missing; install debian-archive-keyring"

  local apt_dir
  apt_dir=$(mktemp -d)
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$apt_dir'" RETURN
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
  local apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null"
    -o "Dir::Etc::PreferencesParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::State::status=/dev/null"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
  )
  apt-get "${apt_opts[@]}" -qq update >&2 ||
    die "apt-get update of $mirror $suite failed; check that the Debian mirror is reachable"
  # Every version the suite offers, newest first; take the first build of the pinned release.
  local deb_version
  deb_version=$(apt-cache "${apt_opts[@]}" madison "$package" | awk -F'|' '{ gsub(/ /, "", $2); print $2 }' |
    grep "^$version-" | head -1 || true)
  [ -n "$deb_version" ] ||
    die "Debian $suite has no $package $version (it has: $(apt-cache "${apt_opts[@]}" madison "$package" | awk -F'|' '{ print $2 }' | xargs)); move the pin in this script"
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" -qq download "$package=$deb_version" >&2) ||
    die "apt-get download $package=$deb_version failed"
  rm -rf "$dest"
  dpkg-deb -x "$apt_dir"/"${package}"_*.deb "$dest" >&2
  echo "$deb_version"
}
