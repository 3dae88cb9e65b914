/* The versions the core reports at run time: its own and libcurl's. */
#include <curl/curl.h>

#include "llmretry.h"

const char *llmretry_version(void)
{
    return LLMRETRY_VERSION;
}

const char *llmretry_libcurl_version(void)
{
    return curl_version_info(CURLVERSION_NOW)->version;
}
