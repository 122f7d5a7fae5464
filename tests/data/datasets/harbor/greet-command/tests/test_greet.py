import subprocess


def run(*args):
    return subprocess.run(["/app/greet", *args], capture_output=True, text=True, check=True).stdout


def test_name():
    assert run("Ada") == "Hello, Ada!\n"


def test_default():
    assert run() == "Hello, world!\n"
