"""After converge: every node has the image, and no staged archive is left behind."""


def test_image_is_loaded(host):
    assert host.run("docker image inspect gpufleet/molecule:1").rc == 0


def test_no_archive_left_in_staging(host):
    assert host.run("ls -A /var/tmp/gpufleet-images").stdout.strip() == ""
