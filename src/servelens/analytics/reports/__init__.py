"""The report jobs (SPEC 5), each a function of the store and a ReportQuery; registry names them."""
