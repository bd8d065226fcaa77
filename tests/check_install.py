#!/usr/bin/env python3
"""check_install: `make install` as a user gets it.  Installs the build
(cmake --install, as the Makefile does) with DESTDIR into WORK/stage under a
prefix that does not exist on the machine, then checks what landed there:

- libhakmem.so -> libhakmem.so.MAJOR -> libhakmem.so.MAJOR.MINOR.PATCH, the
  same for libhakmem-secure.so, each with the soname libNAME.so.MAJOR (MAJOR
  and MINOR from the installed hakmem.h), libhakmem.a, hakmem.h;
- hakmem.pc names the prefix; a C program built with
  `cc $(pkg-config --cflags --libs hakmem)` (PKG_CONFIG_SYSROOT_DIR = the
  staging dir) runs on the installed libhakmem.so;
- the hakmem command in BINDIR, once tools/hakmem is in the tree;
- tests/install_consumer, a CMake project, finds the package
  (find_package(hakmem MAJOR.MINOR), not MAJOR+1) and links the program with
  hakmem::hakmem, hakmem::hakmem_static and hakmem::hakmem_secure.

Each program fails unless malloc is hakmem's, and prints the libhakmem files
mapped into it: the installed one, or none for the static library.

Usage: check_install.py BUILD_DIR WORK_DIR CMAKE CC GENERATOR LIBDIR INCLUDEDIR BINDIR
(the last three relative to the prefix, as GNUInstallDirs sets them.)
"""
import os
import re
import shutil
import subprocess
import sys

PREFIX = "/hakmem-check-install"  # a prefix that is not there: only the staged copy can be used
HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def run(cmd, env=None):
    print("$ " + " ".join(cmd))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit("FAIL: %s exited with %d" % (cmd[0], r.returncode))
    return r.stdout


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LD_", "PKG_CONFIG", "CMAKE_", "DESTDIR", "HAKMEM_"))}
    env.update(extra)
    return env


def dynamic(path, tag):
    out = run(["readelf", "-d", path])
    return re.findall(r"\(%s\)\s+[^[]*\[([^\]]+)\]" % tag, out)


def check_library(libdir, name, major, minor):
    """libNAME.so -> libNAME.so.MAJOR -> libNAME.so.MAJOR.MINOR.PATCH, soname libNAME.so.MAJOR."""
    link, soname = os.path.join(libdir, name + ".so"), name + ".so." + major
    if (os.readlink(link) if os.path.islink(link) else None) != soname:
        fail("%s is not a link to %s" % (link, soname))
    real = os.path.join(libdir, soname)
    target = os.readlink(real) if os.path.islink(real) else ""
    if not re.fullmatch(re.escape(soname) + r"\.%s\.[0-9]+" % re.escape(minor), target):
        fail("%s links to %r, not %s.%s.PATCH" % (real, target, soname, minor))
    elif not os.path.isfile(os.path.join(libdir, target)) or os.path.islink(os.path.join(libdir, target)):
        fail("%s is not a file" % os.path.join(libdir, target))
    sonames = dynamic(link, "SONAME")
    print("%s: soname %s" % (name, sonames))
    if sonames != [soname]:
        fail("%s has the soname %s, not %s" % (name, sonames, soname))
    return os.path.realpath(link)


def check_program(exe, env, expect_lib, version):
    """Runs a probe; it must pass, print VERSION and map exactly EXPECT_LIB (or no libhakmem)."""
    print("$ " + exe)
    r = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=60)
    sys.stdout.write(r.stdout + r.stderr)
    name = os.path.basename(exe)
    if r.returncode != 0:
        fail("%s exited with %d" % (name, r.returncode))
        return
    if "version %s\n" % version not in r.stdout:
        fail("%s does not print version %s" % (name, version))
    mapped = sorted(os.path.realpath(m) for m in re.findall(r"^mapped (.*)$", r.stdout, re.M))
    want = [expect_lib] if expect_lib else []
    if mapped != want:
        fail("%s maps %s, not %s" % (name, mapped or "no libhakmem", want or "no libhakmem"))
    needed = [n for n in dynamic(exe, "NEEDED") if n.startswith("libhakmem")]
    if expect_lib:
        soname = dynamic(expect_lib, "SONAME")
        if needed != soname:
            fail("%s needs %s, not the soname %s" % (name, needed, soname))
    elif needed:
        fail("%s needs %s, though linked with libhakmem.a" % (name, needed))


def main():
    build, work, cmake, cc, generator, libdir_rel, includedir_rel, bindir_rel = sys.argv[1:9]
    shutil.rmtree(work, ignore_errors=True)
    stage = os.path.join(work, "stage")
    root = stage + PREFIX
    libdir = os.path.join(root, libdir_rel)
    includedir = os.path.join(root, includedir_rel)

    run([cmake, "--install", build, "--prefix", PREFIX], env=clean_env(DESTDIR=stage))

    header = open(os.path.join(includedir, "hakmem.h")).read()
    major = re.search(r"^#define HAKMEM_VERSION_MAJOR (\d+)", header, re.M).group(1)
    minor = re.search(r"^#define HAKMEM_VERSION_MINOR (\d+)", header, re.M).group(1)
    version = major + "." + minor
    print("installed hakmem.h: version " + version)

    shared = check_library(libdir, "libhakmem", major, minor)
    secure = check_library(libdir, "libhakmem-secure", major, minor)
    for f in ("libhakmem.a", "pkgconfig/hakmem.pc", "cmake/hakmem/hakmemConfig.cmake",
              "cmake/hakmem/hakmemConfigVersion.cmake", "cmake/hakmem/hakmemTargets.cmake"):
        if not os.path.isfile(os.path.join(libdir, f)):
            fail("%s/%s was not installed" % (libdir_rel, f))
    if os.path.exists(os.path.join(HERE, "..", "tools", "hakmem")):
        command = os.path.join(root, bindir_rel, "hakmem")
        if not os.access(command, os.X_OK):
            fail("the hakmem command is not installed as %s" % command)

    # pkg-config, looking at the staged hakmem.pc only.
    pc = open(os.path.join(libdir, "pkgconfig", "hakmem.pc")).read()
    if not re.search(r"^prefix=%s$" % re.escape(PREFIX), pc, re.M):
        fail("hakmem.pc does not say prefix=" + PREFIX)
    pc_env = clean_env(PKG_CONFIG_LIBDIR=os.path.join(libdir, "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=stage)
    modversion = run(["pkg-config", "--modversion", "hakmem"], env=pc_env).strip()
    if not modversion.startswith(version + "."):
        fail("pkg-config --modversion hakmem says %s, the header %s" % (modversion, version))
    flags = run(["pkg-config", "--cflags", "--libs", "hakmem"], env=pc_env).split()
    print("pkg-config --cflags --libs hakmem: " + " ".join(flags))
    probe_pc = os.path.join(work, "probe_pkgconfig")
    run([cc, "-o", probe_pc, os.path.join(HERE, "install_consumer", "probe.c")] + flags)
    check_program(probe_pc, clean_env(LD_LIBRARY_PATH=libdir), shared, version)

    # The CMake package.
    consumer = os.path.join(work, "consumer")
    run([cmake, "-S", os.path.join(HERE, "install_consumer"), "-B", consumer, "-G", generator,
         "-DCMAKE_C_COMPILER=" + cc, "-DCMAKE_PREFIX_PATH=" + root, "-DHAK_VERSION=" + version],
        env=clean_env())
    cache = open(os.path.join(consumer, "CMakeCache.txt")).read()
    found = re.search(r"^hakmem_DIR:PATH=(.*)$", cache, re.M).group(1)
    if os.path.realpath(found) != os.path.realpath(os.path.join(libdir, "cmake", "hakmem")):
        fail("find_package(hakmem) found %s, not the staged package" % found)
    run([cmake, "--build", consumer], env=clean_env())
    exe = lambda n: os.path.join(consumer, n)
    check_program(exe("probe_cmake"), clean_env(), shared, version)  # through its RUNPATH
    check_program(exe("probe_static"), clean_env(), None, version)
    check_program(exe("probe_secure"), clean_env(), secure, version)

    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("install: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
