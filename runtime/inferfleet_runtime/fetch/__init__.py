"""`inferfleet-runtime fetch`: model sources (file://, hf://, s3://) and the content digest of what was fetched."""
