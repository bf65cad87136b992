"""Two fixes to Beam's S3 FileSystem (``apache_beam.io.aws``), applied when ``ldp_beam.transforms``
is imported (every process that runs one of our steps does, workers included):

* **Empty objects.** Beam writes through a multipart upload and completes it with no part when
  nothing was written, which S3 and S3-compatible servers reject ("You must specify at least one
  part" / MalformedXML): an empty dead-letter file or any empty ``WriteToText`` output on
  ``s3://`` failed the run. S3 sets no minimum size on the last part, so an empty object is one
  empty part, which :func:`apply` adds.
* **One client per settings.** Beam builds a new boto3 session and client for every file-system
  call (each ``exists``, ``open``, ``rename``, ``match``): about half a second each here, spent
  loading botocore's service model, and dozens of them per run. boto3 clients are thread-safe,
  so one client is kept per process and per settings (the S3 options and the ``AWS_*``
  environment they fall back on) and reused; Beam's per-call state (the download position) stays
  per call.
"""
from __future__ import annotations

import os
import threading

from apache_beam.options import pipeline_options

_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_CA_BUNDLE")
_clients: dict = {}
_lock = threading.Lock()


def _settings(options) -> tuple:
    names = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token", "s3_endpoint_url",
             "s3_disable_ssl", "s3_region_name", "s3_api_version", "s3_verify")
    if isinstance(options, pipeline_options.PipelineOptions):
        o = options.view_as(pipeline_options.S3Options)
        vals = tuple(getattr(o, n, None) for n in names)
    else:
        vals = tuple((options or {}).get(n) for n in names)
    return (os.getpid(), vals, tuple(os.environ.get(k) for k in _ENV))


def apply() -> None:
    try:  # no AWS extra: no s3:// at all
        # lazy: optional dependency (the [s3] extra: boto3, Beam's AWS extra)
        from apache_beam.io.aws.clients.s3 import boto3_client
        from apache_beam.io.aws.s3io import S3Uploader
    except ImportError:
        return
    if getattr(S3Uploader.finish, "_ldp_beam", False):
        return
    finish = S3Uploader.finish

    def finish_with_a_part(self):
        if not self.parts and not self.buffer:
            self._write_to_s3(b"")
        return finish(self)

    finish_with_a_part._ldp_beam = True
    S3Uploader.finish = finish_with_a_part

    init = boto3_client.Client.__init__

    def shared_client_init(self, options):
        key = _settings(options)
        with _lock:
            client = _clients.get(key)
        if client is None:
            init(self, options)
            with _lock:
                _clients.setdefault(key, self.client)
            return
        self.client = client
        self._download_request = None
        self._download_stream = None
        self._download_pos = 0

    boto3_client.Client.__init__ = shared_client_init
