"""What error pages and error mails may show (settings.DEFAULT_EXCEPTION_REPORTER_FILTER)."""

import re

from django.views.debug import SafeExceptionReporterFilter


class ExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, also hiding database URLs: a DATABASE_URL holds the password in clear,
    and runserver passes the whole environment to the technical 500 page as request.META."""

    hidden_settings = re.compile(r"API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|DATABASE_URL|DSN", flags=re.I)
